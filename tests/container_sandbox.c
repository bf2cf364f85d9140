/* Run a shell command the way a container started the default way runs it (Docker's default seccomp
 * profile and capabilities, as Kaggle, Colab and JupyterHub on Kubernetes use): unshare, setns, mount,
 * umount2 and clone with a CLONE_NEW* flag fail with EPERM, clone3 with ENOSYS (so libc falls back to
 * clone), and capsh drops CAP_SYS_ADMIN and CAP_NET_ADMIN. Built by tests/test_platform_container.py.
 *
 *     container_sandbox 'unshare -Urn true'      -> unshare: ... Operation not permitted
 */
#define _GNU_SOURCE  /* the CLONE_NEW* flags of sched.h */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "container_sandbox: only x86_64 and aarch64"
#endif

#define NEW_NAMESPACE (CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET \
                       | CLONE_NEWCGROUP)
#define REFUSE(nr, err) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), \
                        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err))

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s 'COMMAND'\n", argv[0]);
        return 2;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        REFUSE(__NR_unshare, EPERM),
        REFUSE(__NR_setns, EPERM),
        REFUSE(__NR_mount, EPERM),
        REFUSE(__NR_umount2, EPERM),
        REFUSE(__NR_clone3, ENOSYS),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_clone, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),  /* clone's flags, low half */
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NEW_NAMESPACE, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
        perror("container_sandbox: prctl");
        return 1;
    }
    execlp("capsh", "capsh", "--drop=cap_sys_admin,cap_net_admin", "--", "-c", argv[1], (char *)NULL);
    perror("container_sandbox: capsh (Debian: apt-get install libcap2-bin)");
    return 127;
}
