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


# --- word for word: each finding's kind, file, line, ranks and message; the boundaries of each rule ---

def test_by_rank_prefers_the_rank_init_gave_over_the_one_the_events_carry():
    spawned = [ev("start", rank=5), ev("init", rank=1, world=2)]
    assert detect.by_rank([spawned]) == {1: spawned}


def test_no_sampler_message_word_for_word():
    ranks = {r: [loader(), *epoch(0, range(256))] for r in (0, 1)}
    (f,) = detect.no_sampler(ranks)
    assert (f.kind, f.file, f.line, f.ranks, f.lines) == ("no-sampler", "", 10, (0, 1), {})
    assert f.message == (
        "Every rank trains on the same samples (256 of the first 256 indices drawn on rank 0 were drawn on every "
        "rank): this DataLoader has no DistributedSampler, so each rank goes through the whole data set and 2 ranks "
        "do the work of one. Give it sampler=DistributedSampler(dataset) (and no shuffle=True: the sampler "
        "shuffles).")


def test_no_sampler_needs_two_ranks_on_the_loader_and_more_shared_samples_than_ranks():
    only_rank_0 = {0: [loader(), *epoch(0, range(256))], 1: []}
    assert detect.no_sampler(only_rank_0) == []
    two_shared = {0: [loader(), *epoch(0, range(0, 128))], 1: [loader(), *epoch(0, [0, 1, *range(128, 254)])]}
    assert detect.no_sampler(two_shared) == []  # as many shared samples as ranks: a sampler's padding
    three = {0: [loader(), *epoch(0, range(0, 128))], 1: [loader(), *epoch(0, [0, 1, 2, *range(128, 253)])]}
    (f,) = detect.no_sampler(three)
    assert "(3 of the first 128 indices drawn on rank 0 were drawn on every rank)" in f.message


def test_no_sampler_when_every_rank_draws_the_whole_set_however_small():
    tiny = {r: [loader(data="2:(a,b)"), *epoch(0, [0, 1])] for r in (0, 1)}
    (f,) = detect.no_sampler(tiny)
    assert "(2 of the first 2 indices drawn on rank 0 were drawn on every rank)" in f.message


def test_no_sampler_one_finding_per_loader_after_a_clean_one():
    def rank(r):
        return [loader(0, data=f"256:{r}"), loader(1, line=30), loader(2, line=40),
                *epoch(0, range(256), loader_n=0), *epoch(1, range(256), loader_n=1),
                *epoch(2, range(256), loader_n=2)]
    found = detect.no_sampler({r: rank(r) for r in (0, 1)})
    assert [(f.kind, f.line, f.ranks) for f in found] == [("no-sampler", 30, (0, 1)), ("no-sampler", 40, (0, 1))]


def test_set_epoch_missing_message_word_for_word():
    (f,) = detect.set_epoch_missing({r: dist_epochs([0, 0, 0]) for r in (0, 1)})
    assert (f.kind, f.file, f.line, f.ranks) == ("set-epoch-missing", "", 14, (0, 1))
    assert f.message == (
        "A shuffling DistributedSampler went through 3 epochs with the same order: its epoch stayed 0, and the "
        "order is drawn from seed + epoch. Call sampler.set_epoch(epoch) before each epoch's loop.")


def test_set_epoch_missing_after_an_evaluation_epoch():
    events = [loader(distributed=True), *epoch(0, range(128), distributed=True, trained=False, shuffle=True,
                                                epoch=0, padded=0)]
    for ep in (1, 2):
        events += epoch(ep, range(128), distributed=True, shuffle=True, epoch=0, padded=0)
    (f,) = detect.set_epoch_missing({0: events, 1: events})
    assert "through 2 epochs" in f.message


def test_set_epoch_is_per_loader_and_each_line_is_a_finding():
    alternating = [loader(0, distributed=True), loader(1, distributed=True, line=30)]
    for ep, (n, number) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        alternating += epoch(ep, range(128), distributed=True, line=14 + 20 * n, loader_n=n, shuffle=True,
                             epoch=number, padded=0)
    assert detect.set_epoch_missing({0: alternating}) == []  # each loader's epoch goes 0, 1
    stuck = [loader(0, distributed=True), loader(1, distributed=True, line=30)]
    for ep, n in enumerate([0, 1, 0, 1]):
        stuck += [dict(e, file="helpers.py" if n else "") for e in epoch(
            ep, range(128), distributed=True, line=14, loader_n=n, shuffle=True, epoch=0, padded=0)]
    found = detect.set_epoch_missing({0: stuck})
    assert [(f.file, f.line, f.ranks) for f in found] == [("", 14, (0,)), ("helpers.py", 14, (0,))]
    other_line = [e if e.get("loader") != 1 or e["k"] == "loader" else dict(e, line=e["line"] + 20, file="")
                  for e in stuck]
    found = detect.set_epoch_missing({0: other_line})
    assert [(f.file, f.line) for f in found] == [("", 14), ("", 34)]


def test_padded_evaluation_message_word_for_word():
    (f,) = detect.padded_evaluation({r: dist_epochs([0], trained=False, padded=1) for r in (0, 1)})
    assert (f.kind, f.file, f.line, f.ranks) == ("padded-evaluation", "", 14, (0, 1))
    assert f.message == (
        "This DistributedSampler pads its 255 samples with 1 repeated one(s), so that every rank gets as many: "
        "an evaluation over all ranks counts 1 sample(s) twice. Count only the real samples (e.g. each rank takes "
        "range(rank, len(dataset), world_size)), or use a size divisible by 2.")


def test_every_rank_saves_message_word_for_word_and_the_first_rank_line_and_file():
    ranks = {r: [dict(save(17 + r, "/x/y/my ckpt.pt"), file="helpers.py")] for r in (0, 1, 2)}
    (f,) = detect.every_rank_saves(ranks)
    assert (f.kind, f.file, f.line, f.ranks) == ("every-rank-saves", "helpers.py", 17, (0, 1, 2))
    assert f.message == (
        "Ranks 0, 1, 2 all write my ckpt.pt: they race to write the same file (a reader may find one rank's "
        "half-written bytes), and the work is done 3 times. Save on one rank: if dist.get_rank() == 0: "
        "torch.save(...), then dist.barrier() before anyone loads it.")
    relative = {r: [{"k": "save", "line": 4, "path": "ckpt.pt"}] for r in (0, 1)}  # no file: the script
    (f,) = detect.every_rank_saves(relative)
    assert (f.file, f.line) == ("", 4) and "all write ckpt.pt:" in f.message


def test_module_prefix_message_word_for_word():
    (f,) = detect.module_prefix({0: [save(18, "/x/m.pt", ddp_state=True)], 1: []})
    assert f.message == (
        "This saves the DDP wrapper's state_dict(): every key starts with 'module.', and a plain model's "
        "load_state_dict() refuses them (unexpected keys). Save model.module.state_dict() instead.")


def test_grouped_keeps_the_file_and_takes_the_script_when_there_is_none():
    in_helpers = {0: [dict(save(18, "/x/m.pt", ddp_state=True), file="helpers.py")], 1: []}
    assert [(f.file, f.line) for f in detect.module_prefix(in_helpers)] == [("helpers.py", 18)]
    no_file = {0: [{"k": "save", "line": 18, "path": "/x/m.pt", "ddp_state": True}], 1: []}
    assert [(f.file, f.line) for f in detect.module_prefix(no_file)] == [("", 18)]


def accumulate(micro, lines=(15,), files=("",)):
    """Two optimizer steps of ``micro`` synchronizing backward passes each, the i-th at lines[i % len]."""
    events = []
    for _ in range(2):
        for i in range(micro):
            events += [ev("forward", 14, model=0, sync=True),
                       dict(ev("backward", lines[i % len(lines)]), file=files[i % len(files)])]
        events.append(ev("step", 16, opt=0))
    return events


def test_accumulation_message_word_for_word_from_two_backwards_on_the_first_line():
    (f,) = detect.accumulation_without_no_sync({r: accumulate(2, lines=(15, 19)) for r in (0, 1)})
    assert (f.kind, f.file, f.line, f.ranks) == ("accumulation-without-no-sync", "", 15, (0, 1))
    assert f.message == (
        "2 backward passes per optimizer step, and DDP all-reduced the gradients after each of them: 1 of every 2 "
        "all-reduces are wasted. Run all but the last micro-batch inside `with model.no_sync():`, so only the last "
        "backward all-reduces.")


def test_accumulation_one_finding_per_line_and_file():
    events = accumulate(2, lines=(15,)) + accumulate(2, lines=(25,)) + accumulate(2, files=("helpers.py",))
    found = detect.accumulation_without_no_sync({0: events})
    assert [(f.file, f.line) for f in found] == [("", 15), ("", 25), ("helpers.py", 15)]


def ddp_forward(batch):
    return {r: [ev("ddp", 12, model=0, batchnorm=2), ev("forward", 20, model=0, sync=True, batch=batch)]
            for r in (0, 1)}


def test_batchnorm_message_word_for_word_and_the_threshold():
    (f,) = detect.batchnorm_small_batch(ddp_forward(detect.SMALL_BATCH - 1))
    assert (f.kind, f.file, f.line, f.ranks) == ("batchnorm-small-batch", "", 12, (0, 1))
    assert f.message == (
        "This DDP model has 2 BatchNorm layer(s), and each rank trains on 7 sample(s) a step: every BatchNorm "
        "normalizes with the mean and variance of its own rank's 7 samples, not of the 14 of the step. Convert "
        "them before wrapping: model = nn.SyncBatchNorm.convert_sync_batchnorm(model), or give each rank at "
        "least 8 samples.")
    assert detect.batchnorm_small_batch(ddp_forward(detect.SMALL_BATCH)) == []


def test_differ_is_relative_to_the_scale_with_a_floor_for_zero():
    def p(sums, scale):
        return {"sums": sums, "scale": scale}
    assert detect._differ(p([1e-9], [0.0]), p([0.0], [0.0]))  # a scale of 0: any difference counts
    assert not detect._differ(p([2.0], [1e7]), p([1.0], [1e7]))  # exactly 1e-7 of the scale: the same
    assert detect._differ(p([2.0 + 2 ** -20], [1e7]), p([1.0], [1e7]))
    assert not detect._differ(p([1.5], [1e7]), p([1.0], [1e7]))
    assert not detect._differ(p([1.0, 5.0], [1.0]), p([1.0, 9.0], [1.0, 1.0]))  # only the sums with a scale


def test_gradients_not_synchronized_message_word_for_word():
    in_helpers = [dict(e, file="helpers.py") if e["k"] == "step" else e for e in trained([0.5])]
    ranks = {0: in_helpers, 1: trained([0.7]), 2: trained([0.5])}  # rank 0's step line names the finding
    (f,) = detect.gradients_not_synchronized(ranks)
    assert (f.kind, f.file, f.line, f.ranks) == ("gradients-not-synchronized", "helpers.py", 22, (0, 1, 2))
    assert f.message == (
        "The parameters were the same on every rank before the first step and differ after step 1: each rank "
        "applied its own gradients, so the ranks train 3 different models. Wrap the model in "
        "DistributedDataParallel (or all-reduce the gradients before optimizer.step()).")


def test_gradients_not_synchronized_without_a_step_event_or_file():
    ranks = {r: [params(0, [1.0]), params(1, [0.5 + r])] for r in (0, 1)}
    (f,) = detect.gradients_not_synchronized(ranks)
    assert (f.file, f.line, f.ranks) == ("", None, (0, 1))
    no_file = {r: [params(0, [1.0]), {"k": "step", "line": 22, "opt": 0, "step": 1}, params(1, [0.5 + r])]
               for r in (0, 1)}
    assert [(f.file, f.line) for f in detect.gradients_not_synchronized(no_file)] == [("", 22)]


def test_gradients_not_synchronized_a_rank_without_params_is_no_proof():
    missing_before = {0: trained([0.5]), 1: trained([0.7])[1:]}
    missing_after = {0: trained([0.5]), 1: trained([0.7])[:2]}
    assert detect.gradients_not_synchronized(missing_before) == []
    assert detect.gradients_not_synchronized(missing_after) == []


def test_gradients_not_synchronized_the_first_step_that_differs_even_if_not_recorded_each_step():
    ranks = {r: [params(0, [1.0]), params(1, [0.5]), ev("step", 22, opt=0, step=2), params(2, [0.5 + r])]
             for r in (0, 1)}
    (f,) = detect.gradients_not_synchronized(ranks)
    assert "after step 2" in f.message
    skipped = {r: [params(0, [1.0]), ev("step", 22, opt=0, step=2), params(2, [0.5 + r])] for r in (0, 1)}
    (f,) = detect.gradients_not_synchronized(skipped)
    assert "after step 2" in f.message


def test_gradients_not_synchronized_checks_each_optimizer():
    ranks = {r: [params(0, [1.0 + r], opt=0), params(1, [0.5 + r], opt=0),
                 params(0, [1.0], opt=1), ev("step", 30, opt=1, step=1), params(1, [0.5 + r], opt=1)] for r in (0, 1)}
    (f,) = detect.gradients_not_synchronized(ranks)
    assert f.line == 30


def test_gradients_not_synchronized_compares_every_rank_with_the_first():
    t = 1e-7  # the tolerance at a scale of 1: each neighbour within it, rank 2 not within it of rank 0
    def p(step, value):
        return ev("params", opt=0, step=step, p={"shapes": [[1]], "sums": [value], "scale": [1.0]})
    drifted_before = {r: [p(0, 0.6 * t * r), ev("step", 22, opt=0, step=1), p(1, 5.0 * r)] for r in (0, 1, 2)}
    assert detect.gradients_not_synchronized(drifted_before) == []
    drifted_after = {r: [p(0, 0.0), ev("step", 22, opt=0, step=1), p(1, 0.6 * t * r)] for r in (0, 1, 2)}
    assert [f.line for f in detect.gradients_not_synchronized(drifted_after)] == [22]


def two_tensors(line, op, file=""):
    return dict(ev("collective", line, op=op, tensors=[[[2], "float32"], [[4], "int64"]]), file=file)


def test_mismatched_collectives_message_word_for_word():
    ranks = {0: [two_tensors(8, "all_reduce", "helpers.py")], 1: [coll(10, "broadcast", [8])]}
    (f,) = detect.mismatched_collectives(ranks)
    assert (f.kind, f.file, f.line, f.ranks) == ("mismatched-collectives", "helpers.py", 8, (0, 1))
    assert f.lines == {0: ("helpers.py", 8), 1: ("", 10)}
    assert f.message == (
        "The ranks' collective number 1 differs: rank 0 calls all_reduce(float32[2], int64[4]) at helpers.py "
        "line 8; rank 1 calls broadcast(float32[8]) at line 10. A collective pairs the i-th call of every rank, "
        "so these ranks exchange the wrong tensors or wait forever. Make every rank call the same collectives, "
        "with the same shapes, in the same order.")
    no_file = {0: [{"k": "collective", "line": 8, "op": "barrier"}], 1: [{"k": "collective", "line": 9, "op": "x"}]}
    (f,) = detect.mismatched_collectives(no_file)
    assert (f.file, f.line, f.lines) == ("", 8, {0: ("", 8), 1: ("", 9)})
    assert "rank 0 calls barrier() at line 8; rank 1 calls x() at line 9" in f.message


def test_hang_message_word_for_word_with_ranks_that_finished_or_stopped():
    ranks = {0: [ev("end")], 1: [dict(ev("where", 8, waiting="all_reduce"), file="helpers.py")],
             2: [{"k": "where", "line": 12, "waiting": None}], 3: []}
    (f,) = detect.hang(ranks)
    assert (f.kind, f.file, f.line, f.ranks) == ("hang", "helpers.py", 8, (1, 2))
    assert f.lines == {1: ("helpers.py", 8), 2: ("", 12)}
    assert f.message == (
        "The ranks stopped making progress: rank 0 had finished; rank 1 waits in all_reduce at helpers.py line 8; "
        "rank 2 is at line 12; rank 3 had stopped. A collective returns only when every rank calls it: look for "
        "one that only some ranks reach (inside an `if rank == ...`, or after a loop of different length on each "
        "rank).")


def test_timeout_message_word_for_word_and_its_default_deadline():
    ranks = {r: [{"k": "where", "line": 20 + r, "waiting": None}] for r in (0, 1)}
    for (f,) in (detect.hang(ranks), detect.find_all(ranks)):
        assert (f.kind, f.file, f.line, f.ranks) == ("timeout", "", 20, (0, 1))
        assert f.message == (
            "The script had not finished after 0 s: rank 0 is at line 20; rank 1 is at line 21. Give it a smaller "
            "run (fewer epochs or samples), steps= to stop after that many optimizer steps, or a longer timeout=.")


def test_report_text_word_for_word():
    findings = [Finding("hang", 8, (0, 1), "Look.", "", {0: ("", 8), 1: ("helpers.py", 9)}),
                Finding("script-error", None, (), "Fix it.", "helpers.py")]
    report = Report("train.py", findings, 2, "spawn")
    assert report.text() == str(report) == (
        "distlab.check: train.py on 2 rank(s) (spawn): 2 finding(s)\n"
        "\n[hang] rank 0: line 8, rank 1: helpers.py line 9 (ranks 0, 1)\n  Look.\n"
        "\n[script-error] helpers.py ? (ranks -)\n  Fix it.")
    assert Report("train.py", [], 2).text() == "distlab.check: train.py on 2 rank(s) (torchrun): no finding."
    assert repr(report) == "<distlab.check Report train.py: hang, script-error>"
    assert repr(Report("train.py", [], 2)) == "<distlab.check Report train.py: no finding>"


def test_report_html_word_for_word():
    findings = [Finding("hang", 8, (0, 1), "Look <here>.", ""), Finding("script-error", None, (), "x", "")]
    td = "<td style='text-align:left'>"
    th = "<th style='text-align:left'>"
    assert Report("a&b.py", findings, 2, "spawn")._repr_html_() == (
        "<p><b>distlab.check</b>: a&amp;b.py on 2 rank(s) (spawn): 2 finding(s)</p>"
        f"<table><thead><tr>{th}kind</th>{th}line</th>{th}ranks</th>{th}message</th></tr></thead><tbody>"
        f"<tr>{td}hang</td>{td}line 8</td>{td}0, 1</td>{td}Look &lt;here&gt;.</td></tr>"
        f"<tr>{td}script-error</td>{td}?</td>{td}</td>{td}x</td></tr>"
        "</tbody></table>")
    assert Report("a&b.py", [], 2, "spawn")._repr_html_() == (
        "<p><b>distlab.check</b>: a&amp;b.py on 2 rank(s) (spawn): no finding.</p>")
