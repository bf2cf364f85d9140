"""Is a process still running? For tests that check nothing was left behind."""
import psutil


def running(pid: int) -> bool:
    """True for a live process that is not a zombie. A process may exit between any two looks at
    ``/proc``, so "gone" in the middle of the check counts as not running, never as an error."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
