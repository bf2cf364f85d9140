"""distlab.check's findings from synthetic events: every kind, and its clean counterpart (no process)."""
from distlab.check import detect
from distlab.check.report import Finding, Report

DATA = "256:(a,b);(c,d)"


def ev(k, line=None, **data):
    return {"k": k, "line": line, "file": "", **data}


def loader(n=0, distributed=False, data=DATA, line=10):
    return ev("loader", line, loader=n, sampler="DistributedSampler" if distributed else "RandomSampler",
              distributed=distributed, data=data)


def epoch(ep, indices, distributed=False, trained=True, line=14, loader_n=0, **info):
    indices = list(indices)
    events = [ev("epoch", line, ep=ep, loader=loader_n, distributed=distributed, **info)]
    if trained:
        events.append(ev("backward", line + 3, eps=[ep]))
    return events + [ev("epoch-end", line, ep=ep, drawn=len(indices), indices=list(indices))]


def kinds(ranks):
    return [f.kind for f in detect.find_all(ranks)]


def test_by_rank_takes_the_rank_init_gave_and_drops_the_process_that_spawned():
    child = [ev("start", rank=None), ev("loader", rank=None), ev("init", rank=1, world=2)]
    parent = [ev("start", rank=None), ev("spawn", rank=None)]
    torchrun = [ev("start", rank=0)]
    assert detect.by_rank([parent, child, torchrun]) == {0: torchrun, 1: child}


def test_no_sampler_every_rank_draws_the_same_samples():
    ranks = {r: [loader(), *epoch(0, range(256))] for r in (0, 1)}
    (f,) = detect.find_all(ranks)
    assert (f.kind, f.line, f.ranks) == ("no-sampler", 10, (0, 1))
    assert "DistributedSampler" in f.message and "256 of the first 256" in f.message


def test_no_sampler_also_when_shuffled_differently_but_each_rank_draws_the_whole_set():
    ranks = {0: [loader(), *epoch(0, range(256))], 1: [loader(), *epoch(0, reversed(range(256)))]}
    assert kinds(ranks) == ["no-sampler"]


def test_no_sampler_not_for_disjoint_shards_other_data_evaluation_or_one_rank():
    halves = {0: [loader(), *epoch(0, range(0, 128))], 1: [loader(), *epoch(0, range(128, 256))]}
    own_data = {r: [loader(data=f"256:{r}"), *epoch(0, range(256))] for r in (0, 1)}
    evaluation = {r: [loader(), *epoch(0, range(256), trained=False)] for r in (0, 1)}
    alone = {0: [loader(), *epoch(0, range(256))]}
    sharded = {r: [loader(distributed=True), *epoch(0, range(r, 256, 2), distributed=True, shuffle=True, epoch=0,
                                                       padded=0)] for r in (0, 1)}
    for ranks in (halves, own_data, evaluation, alone, sharded):
        assert kinds(ranks) == []


def dist_epochs(epochs, trained=True, padded=0):
    events = [loader(distributed=True)]
    for ep, number in enumerate(epochs):
        events += epoch(ep, range(0, 128), distributed=True, trained=trained, shuffle=True, epoch=number,
                        padded=padded)
    return events


def test_set_epoch_missing_is_the_same_epoch_number_twice_in_training():
    (f,) = detect.find_all({r: dist_epochs([0, 0, 0]) for r in (0, 1)})
    assert (f.kind, f.line, f.ranks) == ("set-epoch-missing", 14, (0, 1))
    assert "3 epochs" in f.message and "set_epoch(epoch)" in f.message


def test_set_epoch_called_or_evaluation_or_no_shuffle_is_clean():
    assert kinds({r: dist_epochs([0, 1, 2]) for r in (0, 1)}) == []
    assert kinds({r: dist_epochs([0, 0], trained=False) for r in (0, 1)}) == []
    plain = [loader(distributed=True)] + [e for ep in range(2) for e in epoch(
        ep, range(128), distributed=True, shuffle=False, epoch=0, padded=0)]
    assert kinds({0: plain, 1: plain}) == []


def test_padded_evaluation_counts_the_repeated_samples():
    ranks = {r: dist_epochs([0], trained=False, padded=1) for r in (0, 1)}
    (f,) = detect.find_all(ranks)
    assert f.kind == "padded-evaluation" and "pads its 255 samples with 1 repeated" in f.message


def test_padded_training_or_exact_evaluation_is_clean():
    assert kinds({r: dist_epochs([0], trained=True, padded=1) for r in (0, 1)}) == []
    assert kinds({r: dist_epochs([0], trained=False, padded=0) for r in (0, 1)}) == []


def save(line, path, ddp_state=False):
    return ev("save", line, path=path, ddp_state=ddp_state)


def test_every_rank_saves_one_file():
    (f,) = detect.find_all({r: [save(17, "/x/ckpt.pt")] for r in (0, 1)})
    assert (f.kind, f.line, f.ranks) == ("every-rank-saves", 17, (0, 1)) and "ckpt.pt" in f.message


def test_saves_on_rank_0_or_to_files_of_their_own_are_clean():
    assert kinds({0: [save(17, "/x/ckpt.pt")], 1: []}) == []
    assert kinds({r: [save(17, f"/x/ckpt{r}.pt")] for r in (0, 1)}) == []
    assert kinds({r: [save(17, None)] for r in (0, 1)}) == []  # a file object with no name


def test_module_prefix_is_a_saved_ddp_state_dict():
    (f,) = detect.find_all({0: [save(18, "/x/m.pt", ddp_state=True)], 1: []})
    assert (f.kind, f.line, f.ranks) == ("module-prefix", 18, (0,)) and "model.module.state_dict()" in f.message
    assert kinds({0: [save(18, "/x/m.pt", ddp_state=False)], 1: []}) == []


def steps(micro, sync_last_only, n=2):
    events = []
    for _ in range(n):
        for i in range(micro):
            events += [ev("forward", 14, model=0, sync=not sync_last_only or i == micro - 1), ev("backward", 15)]
        events.append(ev("step", 16, opt=0))
    return events


def test_accumulation_without_no_sync_counts_the_synchronizing_backwards_per_step():
    (f,) = detect.find_all({r: steps(4, sync_last_only=False) for r in (0, 1)})
    assert (f.kind, f.line, f.ranks) == ("accumulation-without-no-sync", 15, (0, 1))
    assert f.message.startswith("4 backward passes per optimizer step") and "3 of every 4" in f.message


def test_accumulation_with_no_sync_or_one_backward_per_step_is_clean():
    assert kinds({r: steps(4, sync_last_only=True) for r in (0, 1)}) == []
    assert kinds({r: steps(1, sync_last_only=False) for r in (0, 1)}) == []


def params(step, sums, opt=0, shapes=([2, 2],)):
    return ev("params", opt=opt, step=step, p={"shapes": [list(s) for s in shapes], "sums": sums,
                                                "scale": [abs(s) + 1 for s in sums]})


def trained(sums_after, sums_before=(1.0,)):
    return [params(0, list(sums_before)), ev("step", 22, opt=0, step=1), params(1, list(sums_after))]


def test_gradients_not_synchronized_equal_before_different_after():
    (f,) = detect.find_all({0: trained([0.5]), 1: trained([0.7])})
    assert (f.kind, f.line, f.ranks) == ("gradients-not-synchronized", 22, (0, 1)) and "step 1" in f.message


def test_parameters_that_stay_equal_or_differed_from_the_start_or_are_sharded_are_clean():
    assert kinds({0: trained([0.5]), 1: trained([0.5])}) == []
    assert kinds({0: trained([0.5], [1.0]), 1: trained([0.7], [2.0])}) == []  # different from the start
    sharded = {r: [ev("params", opt=0, step=0, p=None), ev("step", 22, opt=0, step=1),
                   ev("params", opt=0, step=1, p=None)] for r in (0, 1)}
    assert kinds(sharded) == []


def coll(line, op, shape):
    return ev("collective", line, op=op, tensors=[[shape, "float32"]])


def test_mismatched_collectives_name_each_rank_line():
    ranks = {0: [coll(6, "all_reduce", [2]), coll(8, "all_reduce", [4])],
             1: [coll(6, "all_reduce", [2]), coll(10, "all_reduce", [8])]}
    (f,) = detect.find_all(ranks)
    assert f.kind == "mismatched-collectives" and f.lines == {0: ("", 8), 1: ("", 10)}
    assert "number 2" in f.message and "rank 1 calls all_reduce(float32[8]) at line 10" in f.message
    assert kinds({r: [coll(6, "all_reduce", [2])] for r in (0, 1)}) == []


def test_hang_names_each_rank_line_and_what_it_waits_in():
    ranks = {0: [ev("where", 8, waiting="all_reduce")], 1: [ev("where", 10, waiting="recv")]}
    (f,) = detect.find_all(ranks, timeout=10)
    assert f.kind == "hang" and f.lines == {0: ("", 8), 1: ("", 10)}
    assert "rank 0 waits in all_reduce at line 8; rank 1 waits in recv at line 10" in f.message
    assert f.where() == "rank 0: line 8, rank 1: line 10"


def test_a_run_too_long_is_a_timeout_not_a_hang():
    ranks = {r: [ev("where", 20, waiting=None)] for r in (0, 1)}
    (f,) = detect.find_all(ranks, timeout=30)
    assert f.kind == "timeout" and "after 30 s" in f.message and "steps=" in f.message


def test_script_error_unless_raised_after_the_deadline():
    (f,) = detect.find_all({0: [ev("error", 5, error="ValueError: x")], 1: []})
    assert (f.kind, f.line, f.ranks) == ("script-error", 5, (0,)) and "ValueError: x" in f.message
    late = {0: [ev("where", 8, waiting="all_reduce"), ev("error", 8, error="RuntimeError: closed")],
            1: [ev("where", 9, waiting="all_reduce")]}
    assert kinds(late) == ["hang"]


def test_every_kind_has_a_detector_and_a_test_name_here():
    import inspect

    source = inspect.getsource(inspect.getmodule(test_every_kind_has_a_detector_and_a_test_name_here))
    for kind in detect.KINDS:
        assert f'"{kind}"' in source, kind


def test_report_renders_a_table_and_text():
    f = Finding("module-prefix", 18, (0,), "Save <model.module>.", "")
    report = Report("train.py", [f], 2, "torchrun")
    html = report._repr_html_()
    assert "<table>" in html and "<td style='text-align:left'>module-prefix</td>" in html and "&lt;model" in html
    assert "[module-prefix] line 18 (ranks 0)" in report.text() and not report.ok
    clean = Report("train.py", [], 2, "torchrun")
    assert clean.ok and "no finding" in clean.text() and "<table>" not in clean._repr_html_()
    assert Finding("hang", 3, (0, 1), "", "helpers.py").where() == "helpers.py line 3"


def test_an_error_after_a_mismatched_collective_is_its_consequence():
    ranks = {0: [coll(8, "all_reduce", [4]), ev("error", 8, error="RuntimeError: reset")],
             1: [coll(10, "all_reduce", [8])]}
    assert kinds(ranks) == ["mismatched-collectives"]


def test_batchnorm_small_batch_names_the_ddp_line():
    ranks = {r: [ev("ddp", 12, model=0, batchnorm=2), ev("forward", 20, model=0, sync=True, batch=4)] for r in (0, 1)}
    (f,) = detect.find_all(ranks)
    assert (f.kind, f.line, f.ranks) == ("batchnorm-small-batch", 12, (0, 1))
    assert "2 BatchNorm layer(s)" in f.message and "4 sample(s)" in f.message and "convert_sync_batchnorm" in f.message


def test_batchnorm_with_enough_samples_synced_or_evaluated_is_clean():
    big = {r: [ev("ddp", 12, model=0, batchnorm=2), ev("forward", 20, model=0, sync=True, batch=32)] for r in (0, 1)}
    synced = {r: [ev("ddp", 12, model=0, batchnorm=0), ev("forward", 20, model=0, sync=True, batch=4)] for r in (0, 1)}
    evaluated = {r: [ev("ddp", 12, model=0, batchnorm=2), ev("forward", 20, model=0, sync=True, batch=None)]
                 for r in (0, 1)}
    for ranks in (big, synced, evaluated):
        assert kinds(ranks) == []
