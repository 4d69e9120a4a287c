"""Issue 39 item 1: a Stage1 step's draws belong to the clip, not to a rank or a micro-batch. Every
random value of a clip (AnyFlow's u1/u2 and noise, H3's anchor and audio noise and audio time,
TF-FM's chunk grid levels) comes from ``fm.clip_generator(seed, step, position)``, and the image
condition's drop from a hash of (seed, step, position): so the clips of one micro-batch of 2 get the
losses, levels, kinds and drops they get as two micro-batches of 1 (gradient accumulation 2) or at
dp rank 1 (world 2), where the positions are the same. (Stage2's per-clip exits:
tests/unit/train/test_stage2.py; whole runs at other topologies: tests/e2e/test_topology_draws.py.)"""

from __future__ import annotations

import pytest
import torch

from solar.config.resolve import resolve_file
from solar.launch.batch import Batch
from solar.models.registry import model_from_config
from solar.objectives import fm
from solar.train.engine import read_records
from solar.train.stage1_step import anyflow_loss, tf_fm_loss
from tests.conftest import CONFIGS
from tests.unit.models.wan_helpers import moving_cameras

TINY = CONFIGS / "tiny"
CONFIG = {"anyflow": TINY / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml",
          "tf_fm": TINY / "wan22_ti2v_5b" / "train_stage1_tf_fm_81f.yaml",
          "h3": TINY / "minimax_h3" / "train_stage1_tf_anyflow_158f.yaml"}
H, W = 4, 6
STEP = 5


def _cfg(route: str, micro: int, accum: int, *sets: str):
    return resolve_file(CONFIG[route], ["data.root=/data", "runtime.output_dir=/out", "checkpoint.path=null",
                                        "checkpoint.weights=null", f"train.micro_batch_size={micro}",
                                        f"train.gradient_accumulation={accum}", "train.global_batch_size=null",
                                        *(["train.fm.image_condition_dropout=0.5"] if route != "h3" else []),
                                        *(["train.anyflow.rescale_non_diffusion=false"] if route != "tf_fm" else []),
                                        *sets]).config


def _batch(model, frames: int, clips: int) -> Batch:
    d = model.cfg.dims
    g = torch.Generator().manual_seed(3)
    return Batch(latents=torch.randn(clips, d.out_channels, frames, H, W, generator=g),
                 prompt=torch.randn(clips, 5, d.text_dim, generator=g), prompt_mask=torch.ones(clips, 5),
                 cameras=moving_cameras(frames, batch=clips), image_condition=None,
                 identities=[{"sample_id": f"s{i}", "start_frame": 0} for i in range(clips)])


def _part(batch: Batch, i: int) -> Batch:
    return Batch(latents=batch.latents[i:i + 1], prompt=batch.prompt[i:i + 1], prompt_mask=batch.prompt_mask[i:i + 1],
                 cameras=batch.cameras[i:i + 1], image_condition=None, identities=batch.identities[i:i + 1])


def _loss(route, model, cfg, batch, *, dp_rank, dp_world, micro, negative=None, silence=None):
    if route == "tf_fm":
        _, records = tf_fm_loss(model, cfg, batch, step=STEP, dp_rank=dp_rank, micro=micro)
    else:
        _, records = anyflow_loss(model, cfg, batch, step=STEP, dp_rank=dp_rank, dp_world=dp_world, micro=micro,
                                  gather=lambda rows: rows, negative=negative, audio_silence=silence)
    return read_records(records)


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k, v in x.items():
            if isinstance(v, float):   # levels to float rounding, losses to reduction order
                assert v == pytest.approx(y[k], rel=1e-5 if k == "loss" else 1e-6), k
            else:
                assert v == y[k], k


@pytest.mark.parametrize("route", ["anyflow", "tf_fm", "h3"])
def test_a_clip_draws_the_same_at_any_micro_batch_split(route):
    frames = 12 if route == "h3" else 9
    together = _cfg(route, 2, 1)
    torch.manual_seed(0)
    model = model_from_config(together, device="cpu")
    batch = _batch(model, frames, 2)
    g = torch.Generator().manual_seed(4)
    negative = torch.randn(5, model.cfg.dims.text_dim, generator=g) if route == "anyflow" else None
    silence = torch.randn(2, 3, model.cfg.audio_in_channels, generator=g) if route == "h3" else None
    kw = {"negative": negative, "silence": silence}
    # world 1: one micro-batch of 2 (positions 0, 1) = two micro-batches of 1 (accumulation 2)
    joint = _loss(route, model, together, batch, dp_rank=0, dp_world=1, micro=0, **kw)
    split_cfg = _cfg(route, 1, 2)
    split = [r for i in range(2)
             for r in _loss(route, model, split_cfg, _part(batch, i), dp_rank=0, dp_world=1, micro=i, **kw)]
    _same(joint, split)
    # world 2 x 1: dp rank 1's clip is position 1
    world2 = _cfg(route, 1, 1)
    _same(joint[1:], _loss(route, model, world2, _part(batch, 1), dp_rank=1, dp_world=2, micro=0, **kw))
    if route != "tf_fm":   # the kinds follow the position: of 2, one diffusion, round(0.5) = 0 consistency
        assert [r["kind"] for r in joint] == ["diffusion", "flow_map"]
    if route != "h3":      # with p = 0.5 this step drops one of the two clips' condition
        assert sorted(r["image_condition_dropped"] for r in joint) == [False, True]


def test_a_clip_generator_is_its_position_not_its_micro_batch():
    """ClipDraws stacks each clip's own draws; ``clips=`` draws for some clips only, leaving the others'
    generators where they were."""
    both = fm.ClipDraws(1, 2, 6, 2, "critic")
    alone = fm.ClipDraws(1, 2, 7, 1, "critic")
    assert fm.first_position(1, 2, 1, 2) == 6 and fm.first_position(3, 4, 0, 2) == 6
    x = both.noise((2, 3, 4), "cpu", clips=[1])
    assert torch.equal(x[0], torch.zeros(3, 4)) and torch.equal(x[1:], alone.noise((1, 3, 4), "cpu"))
    y = both.noise((2, 5), "cpu")
    assert torch.equal(y[0], torch.randn(5, generator=fm.clip_generator(1, 2, 6, "critic")))
    assert torch.equal(y[1:], alone.noise((1, 5), "cpu"))
    assert not torch.equal(fm.ClipDraws(1, 2, 6, 1, "student").noise((1, 5), "cpu"), y[:1])


def test_a_non_diffusion_clip_is_rescaled_by_the_diffusion_clips_of_earlier_micro_batches():
    """AnyFlow's rescale_non_diffusion on: the flow-map clip at position 1 is rescaled by the step's
    diffusion losses seen so far, so in the second of two micro-batches (accumulation 2) it is rescaled by
    the first micro-batch's diffusion clip, as in one micro-batch of 2: the gather the trainer binds
    (solar.train.objective) keeps the step's earlier micro-batches. (Guidance off: no negative prompt file.)"""
    from solar.config.resolve import resolve_file as resolve
    from solar.launch.distributed import Dist
    from solar.train.objective import objective_for

    on = ["train.anyflow.rescale_non_diffusion=true", "train.anyflow.guidance_scale=1.0"]
    together = _cfg("anyflow", 2, 1, *on)
    torch.manual_seed(0)
    model = model_from_config(together, device="cpu")
    batch = _batch(model, 9, 2)
    joint = read_records(anyflow_loss(model, together, batch, step=STEP, dp_rank=0, dp_world=1, micro=0,
                                      gather=lambda rows: rows)[1])
    assert [r["kind"] for r in joint] == ["diffusion", "flow_map"]
    split = resolve(CONFIG["anyflow"], ["data.root=/data", "runtime.output_dir=/out", "checkpoint.path=null",
                                        "checkpoint.weights=null", "train.micro_batch_size=1",
                                        "train.gradient_accumulation=2", "train.global_batch_size=null",
                                        "train.fm.image_condition_dropout=0.5", *on])
    one = Dist(rank=0, world=1, local_rank=0, local_world=1, sp=1, device=torch.device("cpu"), backend=None)
    run, term = objective_for(split, one, None)
    assert term == "anyflow"
    records = [r for micro in range(2) for r in read_records(run(model, _part(batch, micro), STEP, micro)[1])]
    assert records[1]["loss"] == pytest.approx(joint[1]["loss"], rel=1e-5)
    # without the first micro-batch's diffusion clip to rescale by, the flow-map clip's loss is another
    alone = read_records(anyflow_loss(model, split.config, _part(batch, 1), step=STEP, dp_rank=0, dp_world=1,
                                      micro=1, gather=lambda rows: rows)[1])
    assert alone[0]["loss"] != pytest.approx(joint[1]["loss"], rel=1e-3)
