"""Strategies on the shared loop, the ramp-up, and the publish gate (synthetic tensors, fast)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")

from edge_agent.config import TrainerSection  # noqa: E402
from edge_agent.trainer_config import EwcConfig, LwfConfig, RehearsalConfig  # noqa: E402
from trainer.continual import ramp, train_generation  # noqa: E402
from trainer.gate import gate  # noqa: E402
from trainer.models import build_model  # noqa: E402
from trainer.photos import INFERENCE_BATCH  # noqa: E402
from trainer.strategies.base import Generation, get_strategy, strategies  # noqa: E402
from trainer.strategies.ewc import EWC  # noqa: E402
from trainer.strategies.lwf import LwF  # noqa: E402
from trainer.strategies.rehearsal import Rehearsal, select  # noqa: E402

pytestmark = pytest.mark.both_cores  # it trains: make test runs it beside the waiting tests, never beside another trainer


def settings(**kw) -> TrainerSection:
    """[trainer] for a quick loop: no SWA, no distillation, seed 0 (each test says what else it needs)."""
    return TrainerSection(**{"epochs": 2, "batch_size": 8, "ramp_epochs": 10, "seed": 0, "swa_epochs": 0, "distill": 0.0, **kw})


FAST = settings()
LR = 5e-4


def toy(n_per_class=6, classes=3, seed=0) -> Generation:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_per_class * classes, 3, 128, 128, generator=g) * 0.3
    y = torch.arange(classes).repeat_interleave(n_per_class)
    for c in range(classes):  # a class-specific colour shift: learnable
        x[y == c, c % 3] += 1.5
    return Generation(x, y)


def test_ramp_up():
    values = [ramp(e, 10) for e in range(12)]
    assert values[0] == pytest.approx(0.0067, abs=1e-3)
    assert values == sorted(values) and values[10] == values[11] == 1.0
    assert ramp(0, 0) == 1.0


def test_the_registry_and_the_config_know_the_same_strategies_each_with_its_options_class():
    from edge_agent.trainer_config import STRATEGY_CONFIGS

    found = strategies()
    assert set(found) == set(STRATEGY_CONFIGS) >= {"finetune", "ewc", "rehearsal", "lwf"}
    assert all(cls.Config is STRATEGY_CONFIGS[name] for name, cls in found.items())
    with pytest.raises(ValueError, match="unknown strategy"):
        get_strategy("magic")


@pytest.mark.parametrize("name", ["finetune", "ewc", "rehearsal", "lwf"])
def test_each_strategy_trains_a_generation(tmp_path, name):
    torch.manual_seed(0)
    model = build_model(3)
    data = toy()
    pseudo = Generation(data.x[:6], data.y[:6], torch.full((6,), 0.95), torch.ones(6, dtype=torch.bool))
    strategy = get_strategy(name)(tmp_path / name, RehearsalConfig(per_class=2) if name == "rehearsal" else None)
    out, used = train_generation(model, data + pseudo, strategy, FAST, LR)
    assert not list((tmp_path / name).iterdir())  # nothing kept until the candidate is accepted
    strategy.after(out, used)
    assert out.num_classes == 3
    assert not torch.equal(out.head.weight, model.head.weight)  # it learnt
    if name == "ewc":
        assert (tmp_path / name / "ewc.pt").is_file()
    if name == "rehearsal":
        mem = torch.load(tmp_path / name / "memory.pt", weights_only=True)
        assert torch.bincount(mem["y"]).tolist() == [2, 2, 2]  # class-balanced, true labels only


def test_new_class_grows_the_head(tmp_path):
    model = build_model(3)
    data = toy(classes=4)  # an expert labelled a 4th disease
    out, _ = train_generation(model, data, get_strategy("finetune")(tmp_path), FAST, LR, num_classes=4)
    assert out.num_classes == 4 and out(data.x[:2]).shape == (2, 4)


def test_ewc_penalty_is_zero_at_the_anchor_and_grows_away_from_it(tmp_path):
    model = build_model(3)
    ewc = EWC(tmp_path, EwcConfig(ewc_lambda=10.0))
    ewc.before(model, model, toy())
    x = toy().x[:4]
    assert float(ewc.penalty(model, x, model(x)).detach()) == pytest.approx(0.0, abs=1e-9)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05)
    assert float(ewc.penalty(moved, x, moved(x)).detach()) > 0


def test_lwf_penalty_is_zero_for_the_teacher_itself(tmp_path):
    model = build_model(3).eval()
    lwf = LwF(tmp_path, LwfConfig(temperature=2.0))
    lwf.before(model, model, toy())
    x = toy().x[:4]
    assert float(lwf.penalty(model, x, model(x)).detach()) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("how", ["herding", "distance"])
def test_exemplar_selection(how):
    feats = torch.randn(50, 16, generator=torch.Generator().manual_seed(1))
    idx = select(feats, 10, how)
    assert len(idx) == 10 and len(set(idx.tolist())) == 10
    with pytest.raises(ValueError):
        select(feats, 3, "vibes")


def test_rehearsal_replays_its_memory(tmp_path):
    model = build_model(3)
    r = Rehearsal(tmp_path, RehearsalConfig(per_class=3))
    r.after(model, toy())
    replay = r.before(model, model, toy(n_per_class=1, seed=5))
    assert len(replay) == 3 + 9


def test_rehearsal_never_replays_a_photo_the_generation_holds_and_keeps_each_photo_once(tmp_path):
    """A retrain is given the shipped replay photos and every expert label each time: replayed again from the
    memory, they counted double, and the memory filled with copies (760 photos by a farm's fifth day, 3x the time)."""
    model = build_model(3).eval()
    r = Rehearsal(tmp_path, RehearsalConfig(per_class=5))
    data = toy(n_per_class=3)
    r.after(model, data)
    assert len(r.before(model, model, data)) == len(data)  # all of the memory is in the generation already
    twice = data + data
    r.after(model, twice + Generation(toy(n_per_class=3, seed=7).x[:2], torch.tensor([0, 0])))
    kept = torch.load(tmp_path / "memory.pt")
    assert len(kept["y"]) == 3 * 3 + 2 and len({p.numpy().tobytes() for p in kept["x"]}) == 11  # each photo once
    assert len(r.before(model, model, data)) == len(data) + 2  # only the two photos it does not hold


def test_a_photo_the_expert_moved_to_another_class_takes_its_new_class_in_the_memory_and_is_not_replayed_under_the_old(tmp_path):
    model = build_model(3).eval()
    r = Rehearsal(tmp_path, RehearsalConfig(per_class=5))
    data = toy(n_per_class=3)
    r.after(model, data)
    moved = data.y.clone()
    moved[0] = (int(moved[0]) + 1) % 3  # the expert corrected the first photo's class
    corrected = Generation(data.x, moved)
    replayed = r.before(model, model, corrected)
    assert len(replayed) == len(data) and torch.equal(replayed.y, moved)  # the old label is not replayed beside the new
    r.after(model, corrected)
    kept = torch.load(tmp_path / "memory.pt")
    same = [i for i, p in enumerate(kept["x"]) if torch.equal(p, data.x[0])]
    assert len(same) == 1 and int(kept["y"][same[0]]) == int(moved[0])


def test_rehearsal_keeps_the_exemplars_of_the_true_labels_and_its_old_memory_chosen_in_feature_space(tmp_path):
    model = build_model(3).eval()
    r = Rehearsal(tmp_path, RehearsalConfig(per_class=3, selection="herding"))
    r.after(model, toy(seed=1))
    old_x, old_y = torch.load(tmp_path / "memory.pt")["x"], torch.load(tmp_path / "memory.pt")["y"]
    new = toy(n_per_class=5, seed=2)
    pseudo = torch.arange(len(new)) % 2 == 0
    r.after(model, Generation(new.x, new.y, pseudo=pseudo))
    kept = torch.load(tmp_path / "memory.pt")
    x, y = torch.cat([new.x[~pseudo], old_x]), torch.cat([new.y[~pseudo], old_y])  # pseudo-labelled photos never kept
    with torch.no_grad():
        feats = model.features(x)
    for c in range(3):
        idx = torch.nonzero(y == c).flatten()
        expected = x[idx[select(feats[idx], 3, "herding")]]
        assert torch.equal(kept["x"][kept["y"] == c], expected)


def test_rehearsal_given_the_features_of_the_true_labels_keeps_what_it_would_choose_and_runs_only_its_old_memory(tmp_path):
    """A retrain hands the rehearsal the features its verdict computed: the same exemplars, none of those photos run
    through the model again (on a device, the memory's choice had been a second pass over every true label)."""
    from trainer.models import features_of

    model = build_model(3).eval()
    first, new = toy(seed=1), toy(n_per_class=5, seed=2)
    pseudo = torch.arange(len(new)) % 2 == 0
    data = Generation(new.x, new.y, pseudo=pseudo)
    kept = []
    for given in (False, True):
        folder = tmp_path / str(given)
        r = Rehearsal(folder, RehearsalConfig(per_class=3, selection="herding"))
        r.after(model, first)
        known = features_of(model, data.x[~pseudo]) if given else None
        rows = []
        features = type(model).features
        model.features = lambda x, rows=rows, features=features: rows.append(len(x)) or features(model, x)  # its copies too
        r.after(model, data, features=known)
        del model.features
        kept.append(torch.load(folder / "memory.pt"))
        assert sum(rows) == (9 if given else 9 + int((~pseudo).sum())), rows  # the old memory: 3 a class
    assert torch.equal(kept[0]["x"], kept[1]["x"]) and torch.equal(kept[0]["y"], kept[1]["y"])
    with pytest.raises(ValueError, match="features of 2 photos for"):
        Rehearsal(tmp_path / "x", RehearsalConfig()).after(model, data, features=torch.zeros(2, model.head.in_features))


def test_gate(tmp_path):
    torch.manual_seed(0)
    data = toy(n_per_class=8)
    classes = ["a", "b", "c"]
    model, _ = train_generation(build_model(3), data, get_strategy("finetune")(tmp_path), settings(epochs=4), LR)
    same = gate(copy.deepcopy(model), model, data.x, data.y, classes)
    assert same.publish and same.metrics["candidate_top1"] == same.metrics["current_top1"]
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.head.bias[1] = -1e4  # class "b" can never win: it collapses
    d = gate(broken, model, data.x, data.y, classes)
    assert not d.publish and "collapsed" in d.reason and d.metrics["collapsed_classes"] == ["b"]
    empty = gate(model, model, data.x[:0], data.y[:0], classes)
    assert not empty.publish and "no validation photos" in empty.reason


def test_ewc_state_accumulates_across_generations(tmp_path):
    model = build_model(3)
    ewc = EWC(tmp_path, EwcConfig(gamma=0.5))
    ewc.after(model, toy())  # seeded without before(): e.g. on the data of the first task
    first = torch.load(tmp_path / "ewc.pt", weights_only=True)["fisher"]
    ewc.after(model, toy())
    second = torch.load(tmp_path / "ewc.pt", weights_only=True)["fisher"]
    name = "head.weight"
    assert torch.allclose(second[name], 1.5 * first[name], rtol=1e-4, atol=1e-9)  # 0.5 * old + new (same data)


@pytest.mark.parametrize("cut", ["empty", "half"])
def test_a_strategy_state_file_cut_short_by_a_crash_is_set_aside_and_the_next_retrain_starts_again(tmp_path, cut):
    """torch.save wrote straight onto memory.pt and ewc.pt: a crash or a power cut mid-write left a file torch.load
    cannot read, and every later retrain failed on it. Now each is written whole or not at all, and one cut short by
    an older version is set aside (kept for a look) and said: rehearsal starts with no memory, EWC estimates afresh."""
    from structlog.testing import capture_logs

    model = build_model(3)
    r, ewc = Rehearsal(tmp_path / "r", RehearsalConfig(per_class=3)), EWC(tmp_path / "e", EwcConfig())
    r.after(model, toy())
    ewc.after(model, toy())
    assert not [p.name for p in (tmp_path / "r").iterdir() if p.name != "memory.pt"]  # (no temporary file left)
    for path in (tmp_path / "r" / "memory.pt", tmp_path / "e" / "ewc.pt"):
        whole = path.read_bytes()
        path.write_bytes(b"" if cut == "empty" else whole[: len(whole) // 2])
    with capture_logs() as logs:
        assert len(r.before(model, model, toy(n_per_class=1, seed=5))) == 3  # this generation alone
        ewc.before(model, model, toy())
        assert ewc.fisher  # estimated afresh on the data the model in service knew
    said = [e for e in logs if e["event"] == "strategy_state_unreadable"]
    assert len(said) == 2 and all(".corrupt-" in e["kept"] for e in said)
    assert len(list((tmp_path / "r").glob("memory.pt.corrupt-*"))) == 1 and not (tmp_path / "r" / "memory.pt").exists()
    r.after(model, toy())  # the next retrain's memory, whole
    assert len(r.before(model, model, toy(n_per_class=1, seed=5))) == 3 + 9


def test_easy_classes_cannot_dominate_the_pseudo_labels():
    from trainer.service import balance_pseudo

    labels = torch.tensor([0, 0, 0, 0, 1, 2, 0, 1])
    pseudo = torch.tensor([True, True, True, True, True, True, False, False])
    f = balance_pseudo(labels, pseudo)
    # pseudo counts: class 0: 4, class 1: 1, class 2: 1 -> median 1: class 0 down to 1/4 each, the rest untouched
    assert f.tolist() == [0.25, 0.25, 0.25, 0.25, 1.0, 1.0, 1.0, 1.0]
    assert balance_pseudo(labels, torch.zeros(8, dtype=torch.bool)).tolist() == [1.0] * 8


def _batchnorm_inputs(model, x):
    """Each BatchNorm layer's input over ``x`` in eval mode (so with the statistics the layers before it have)."""
    seen: dict = {}
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    hooks = [bn.register_forward_pre_hook(lambda m, inp, i=i: seen.setdefault(i, []).append(inp[0].detach())) for i, bn in enumerate(bns)]
    with torch.no_grad():
        model.eval()(x)
    for h in hooks:
        h.remove()
    return bns, {i: torch.cat(v) for i, v in seen.items()}


def test_batchnorm_statistics_are_the_exact_ones_over_clean_photos_in_class_order():
    """Photos in class order (a labelled folder, the replay memory): averaging per-batch statistics would miss the
    spread between classes; the recomputed statistics are the population mean and variance of every layer's input."""
    from trainer.batchnorm import recompute_batchnorm
    from trainer.models import build_model

    torch.manual_seed(0)
    model = build_model(3)
    for bn in model.modules():
        if isinstance(bn, torch.nn.BatchNorm2d):
            bn.running_mean.fill_(5.0)  # statistics left over from augmented batches
            bn.running_var.fill_(9.0)
    x = torch.cat([torch.randn(10, 3, 32, 32) + 2.0 * k for k in range(3)])  # three "classes", in order
    recompute_batchnorm(model, x, batch_size=10)  # one class per batch
    bns, inputs = _batchnorm_inputs(model, x)
    for i, bn in enumerate(bns):
        t = inputs[i].transpose(0, 1).reshape(bn.num_features, -1)
        assert torch.allclose(bn.running_mean, t.mean(1), atol=1e-4, rtol=1e-4)
        assert torch.allclose(bn.running_var, t.var(1), rtol=1e-3)
    assert not model.training
    first = bns[0].running_var.clone()
    recompute_batchnorm(model, x[torch.randperm(len(x))], batch_size=7)  # order and batch size do not matter
    assert torch.allclose(bns[0].running_var, first, rtol=1e-5)


def test_batchnorm_recompute_leaves_a_model_alone_with_fewer_than_two_photos():
    from trainer.batchnorm import recompute_batchnorm
    from trainer.models import build_model

    model = build_model(3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    recompute_batchnorm(model, torch.randn(1, 3, 32, 32))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_lr_schedule_warms_up_decays_and_holds_the_swa_floor():
    from trainer.train import lr_schedule

    plain = lr_schedule(100)
    assert plain(0) == 1.0 and plain(50) == pytest.approx(0.5) and plain(100) == 0.0
    warm = lr_schedule(100, warmup=10)
    assert warm(0) == pytest.approx(0.1) and warm(9) == 1.0 and warm(10) == 1.0
    swa = lr_schedule(100, swa=30)
    assert swa(0) == 1.0 and swa(69) > 0.25 and all(swa(s) == 0.25 for s in range(70, 120))


def test_retrain_with_swa_returns_the_average_of_its_last_epochs(tmp_path, monkeypatch):
    """[trainer] swa_epochs: the candidate's weights are the mean of the last N epochs' weights (BatchNorm recomputed)."""
    seen = []

    class Recording(torch.optim.swa_utils.AveragedModel):
        def update_parameters(self, model):
            seen.append(model.head.weight.detach().clone())
            super().update_parameters(model)

    monkeypatch.setattr(torch.optim.swa_utils, "AveragedModel", Recording)
    model, _ = train_generation(build_model(3), toy(), get_strategy("finetune")(tmp_path), settings(epochs=4, swa_epochs=3), LR)
    assert len(seen) == 3
    torch.testing.assert_close(model.head.weight, torch.stack(seen).mean(0))
    assert not torch.equal(seen[0], seen[-1])  # the average is not just one epoch's weights
    seen.clear()
    train_generation(build_model(3), toy(), get_strategy("finetune")(tmp_path), settings(epochs=4), LR)
    assert seen == []  # swa_epochs 0: the last epoch's weights, nothing averaged


def test_distillation_keeps_a_retrain_closer_to_the_model_in_service(tmp_path):
    """``[trainer] distill``: beside any strategy, the candidate's outputs stay nearer the teacher's."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    previous = build_model(3).eval()
    data = toy(seed=3)
    data = Generation(data.x, (data.y + 1) % 3)  # labels the teacher disagrees with: fine-tuning pulls away from it
    probe = toy(seed=4).x
    with torch.no_grad():
        teacher = F.log_softmax(previous(probe), 1)

    def drift(distill: float) -> float:
        cand, _ = train_generation(
            previous,
            data,
            get_strategy("finetune")(tmp_path / f"d{distill}"),
            settings(epochs=3, distill=distill, distill_photos="all"),
            5e-3,
        )
        with torch.no_grad():
            return float(F.kl_div(F.log_softmax(cand.eval()(probe), 1), teacher, log_target=True, reduction="batchmean"))

    assert drift(10.0) < drift(0.0)


def test_distillation_covers_only_the_photos_whose_label_the_model_in_service_answers(tmp_path):
    """``distill_photos = "agreeing"`` (the default): no pull towards the answer an expert's label corrects; where
    the teacher answers the label, the same term as over all photos."""
    from trainer.continual import _loss_terms

    torch.manual_seed(0)
    previous, model = build_model(3).eval(), build_model(3).eval()
    x = toy(seed=5).x
    with torch.no_grad():
        answer = previous(x).argmax(1)
    pseudo, conf = torch.zeros(len(x), dtype=torch.bool), torch.ones(len(x))
    finetune = get_strategy("finetune")(tmp_path)

    def term(y, photos: str) -> float:
        terms = _loss_terms(
            model, previous, finetune, settings(distill=1.0, distill_photos=photos), x, y, pseudo, conf, 1.0, (len(x), len(x), 0)
        )
        return float(terms["distill"].detach())

    contradicted = (answer + 1) % 3
    assert term(contradicted, "agreeing") == 0.0 < term(contradicted, "all")
    assert term(answer, "agreeing") == pytest.approx(term(answer, "all"))
    half = torch.where(torch.arange(len(x)) % 2 == 0, answer, contradicted)
    assert 0.0 < term(half, "agreeing") < term(half, "all")


def _lite_toy() -> Generation:
    data = toy(n_per_class=4)
    return Generation(torch.nn.functional.interpolate(data.x, size=64), data.y)


def test_a_retrain_of_efficientnet_lite_leaves_its_first_blocks_and_its_batchnorm_statistics_as_they_were(tmp_path):
    torch.manual_seed(0)
    model = build_model(3, "efficientnet-lite0")  # registry default: stem and stages 1-4 held, statistics kept
    for m in model.modules():  # statistics that a recompute over the toy photos would certainly change
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.fill_(0.1)
    out, _ = train_generation(model, _lite_toy(), get_strategy("finetune")(tmp_path / "f"), FAST, 1e-2)
    before, after = model.state_dict(), out.state_dict()
    held = {f"stem.{k}" for k in model.stem.state_dict()} | {f"blocks.{i}.{k}" for i in range(8) for k in model.blocks[i].state_dict()}
    assert all(torch.equal(before[k], after[k]) for k in held)
    assert not torch.equal(before["blocks.8.project.0.weight"], after["blocks.8.project.0.weight"])  # stage 5 on learns
    assert not torch.equal(before["head.weight"], after["head.weight"])
    assert all(torch.equal(before[k], after[k]) for k in before if "running_" in k)  # no statistics recomputed
    assert out.frozen_blocks == 9 and out.keep_batchnorm


def test_trainer_settings_override_what_a_retrain_holds_and_leafnet_holds_nothing_by_default(tmp_path):
    from trainer.continual import hold

    lite = build_model(3, "efficientnet-lite0")
    everything = sum(p.numel() for p in lite.parameters())
    assert hold(lite, settings(frozen_blocks=0, batchnorm="recompute")) == everything and not lite.keep_batchnorm
    assert hold(lite, settings(frozen_blocks=1000)) == lite.head.weight.numel() + lite.head.bias.numel()  # all but the head
    leaf = build_model(3, "LeafNet5")
    assert hold(leaf, settings()) == sum(p.numel() for p in leaf.parameters()) and not leaf.keep_batchnorm
    leaf.train()
    assert all(m.training for m in leaf.modules())
    with pytest.raises(ValueError):
        settings(batchnorm="sometimes")


def test_a_retrain_takes_the_architectures_learning_rate_unless_the_configuration_names_one():
    from trainer.continual import learning_rate

    lite, leaf = build_model(3, "efficientnet-lite0"), build_model(3, "LeafNet5")
    assert learning_rate(leaf, settings()) == 2e-3 and learning_rate(leaf, settings(), pseudo_only=True) == 5e-4
    assert learning_rate(lite, settings()) == 5e-4 and learning_rate(lite, settings(), pseudo_only=True) == 1.25e-4
    assert learning_rate(lite, settings(lr=1e-3, pseudo_only_lr=3e-4)) == 1e-3
    assert learning_rate(lite, settings(lr=1e-3, pseudo_only_lr=3e-4), pseudo_only=True) == 3e-4


def _sizes_seen(model) -> list[int]:
    """The batch sizes ``model`` (and every copy made of it after this call) is given."""
    seen: list[int] = []  # at the head, which every pass ends in (a retrain runs the held blocks apart: Classifier.held)
    model.head.register_forward_pre_hook(lambda _m, inputs: seen.append(len(inputs[0])))
    return seen


def test_the_teacher_goes_on_from_the_students_held_blocks_where_they_are_the_same_and_the_step_is_the_same(tmp_path, monkeypatch):
    """Distillation runs the teacher on every photo: where its held blocks are the student's (a retrain's are, unless
    ``distill_from`` names a version whose blocks differ), their output is computed once; the candidate is the one
    the teacher's own pass gives, to float rounding."""
    from trainer.models._base import Classifier

    def run(teacher_change: float = 0.0, share: bool = True):
        torch.manual_seed(0)
        model = build_model(3, "efficientnet-lite0")
        teacher = copy.deepcopy(model)
        with torch.no_grad():
            teacher.blocks[0].depthwise[0].weight.mul_(1 + teacher_change)
        stems = []
        teacher.stem.register_forward_pre_hook(lambda *_: stems.append(1))  # the teacher's own copy of the held blocks
        with monkeypatch.context() as m:
            if not share:
                m.setattr(Classifier, "same_blocks", lambda *a: False)
            out, _ = train_generation(
                model, _lite_toy(), get_strategy("finetune")(tmp_path / "f"), settings(distill=1.0), 1e-2, teacher=teacher
            )
        return out.state_dict(), len(stems)

    shared, stems_shared = run()
    own, stems_own = run(share=False)
    assert stems_shared == 0 and stems_own > 0  # 2 epochs of 12 photos in parts: the teacher's stem ran each time
    assert max(float((shared[k].float() - own[k].float()).abs().max()) for k in shared) < 1e-5
    _, stems_differ = run(teacher_change=1e-3)  # a teacher whose first held block differs runs its own
    assert stems_differ == stems_own


def test_a_batch_in_parts_takes_the_whole_batchs_step_where_batchnorm_keeps_its_statistics(tmp_path):
    """Labels, pseudo-labels, distillation and the strategy's penalty, each scaled by its part's share: the same step."""
    data = _lite_toy()
    pseudo = torch.arange(len(data)) % 3 == 0
    data = Generation(data.x, data.y, torch.where(pseudo, 0.7, 2.0), pseudo)
    out = {}
    for micro in (0, 3):
        torch.manual_seed(0)
        model = build_model(3, "efficientnet-lite0")
        for m in model.modules():  # no random masks (dropout, stochastic depth): a part draws other ones than the batch
            if hasattr(m, "drop"):
                m.drop = 0.0
        model.dropout.p = 0.0
        seen = _sizes_seen(model)
        cfg = settings(micro_batch=micro, distill=1.0, ramp_epochs=0)
        out[micro], _ = train_generation(model, data, get_strategy("ewc")(tmp_path / f"e{micro}"), cfg, 1e-2)
        fisher = [min(INFERENCE_BATCH, len(data) - i) for i in range(0, len(data), INFERENCE_BATCH)]  # EWC's, in parts
        assert seen[: len(fisher)] == fisher and max(seen[len(fisher) :]) == (8 if micro == 0 else 3)  # then the steps
    start, whole, parts = model.state_dict(), out[0].state_dict(), out[3].state_dict()  # the model given is left as it was
    moved = max(float((whole[k].float() - start[k].float()).abs().max()) for k in whole)
    apart = max(float((whole[k].float() - parts[k].float()).abs().max()) for k in whole)
    assert moved > 5e-3 and apart < 1e-4  # float rounding, through four Adam steps; a part's loss misscaled moves far more


def test_a_stop_asked_during_a_batch_is_taken_before_the_batchs_next_part(tmp_path):
    """SIGTERM must end a retrain within 5 s, and a whole batch takes seconds on a busy CPU: each part checks."""
    from trainer.stop import Stopped

    torch.manual_seed(0)
    model = build_model(3, "efficientnet-lite0")
    seen = _sizes_seen(model)
    with pytest.raises(Stopped, match="while training"):
        train_generation(
            model, _lite_toy(), get_strategy("finetune")(tmp_path / "f"), settings(micro_batch=2), LR, should_stop=lambda: bool(seen)
        )
    assert seen == [2]  # one part of the first batch of 8, not its four


def test_a_stop_asked_during_a_parts_forward_pass_is_taken_before_its_next_layer_and_before_any_backward_pass(tmp_path):
    """On a CPU shared with other work one part's forward pass took over 4 s here (the trainer kills a retrain that
    has not stopped 4 s after SIGTERM): the stop is checked before each layer, and never followed by a backward pass."""
    from trainer.stop import Stopped

    torch.manual_seed(0)
    model = build_model(3, "efficientnet-lite0")
    asked, layers_after, backward = [], [], []
    stem = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    stem.register_forward_hook(lambda *_: asked.append(True))  # the stop comes once the first layer has run
    for m in model.modules():
        if next(m.children(), None) is None and m is not stem:
            m.register_forward_hook(lambda *_: layers_after.append(True) if asked else None)
    model.head.register_full_backward_hook(lambda *_: backward.append(True))
    with pytest.raises(Stopped, match="while training"):
        train_generation(
            model, _lite_toy(), get_strategy("finetune")(tmp_path / "f"), settings(micro_batch=2), LR, should_stop=lambda: bool(asked)
        )
    assert asked and not layers_after and not backward  # the next layer did not run, nor a backward pass


def test_where_batchnorm_normalises_by_the_batch_the_whole_batch_goes_through_at_once(tmp_path):
    from trainer.continual import micro_batch

    torch.manual_seed(0)
    model = build_model(3, "LeafNet5")  # statistics recomputed by default: training mode normalises by the batch
    seen = _sizes_seen(model)
    train_generation(model, toy(n_per_class=4), get_strategy("finetune")(tmp_path / "f"), settings(micro_batch=2), LR)
    assert seen[:4] == [8, 4, 8, 4]  # two epochs of 12 photos (then the statistics are recomputed)
    lite = build_model(3, "efficientnet-lite0")
    lite.freeze(0, keep_batchnorm=False)
    assert micro_batch(lite.train(), settings(micro_batch=2)) == 8
    lite.freeze(0, keep_batchnorm=True)
    assert micro_batch(lite.train(), settings(micro_batch=2)) == 2 and micro_batch(lite.train(), settings(micro_batch=0)) == 8


def test_by_default_a_pretrained_network_with_its_statistics_kept_trains_four_photos_a_pass():
    """4, not 8: one retrain of v4000 on 100 labels peaked 176 MiB lower, no slower (benchmarks/results/retrain-cost-v4000-micro4)."""
    from trainer.continual import micro_batch

    lite = build_model(3, "efficientnet-lite0")
    lite.freeze(0, keep_batchnorm=True)
    assert micro_batch(lite.train(), TrainerSection()) == 4
