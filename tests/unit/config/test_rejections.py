"""Each rejection of contract.md §2 through the real CLI: one line, exit 2, nothing written."""

from __future__ import annotations

import pytest

from tests.conftest import CONFIGS
from tests.unit.config.refusal import refused_line

TINY = CONFIGS / "tiny"
WAN_FM = TINY / "wan22_ti2v_5b" / "train_stage0p5_fm_81f.yaml"
WAN_S1 = TINY / "wan22_ti2v_5b" / "train_stage1_tf_anyflow_81f.yaml"
A14B = TINY / "wan22_i2v_a14b" / "train_stage0p5_fm_81f.yaml"
LTX = TINY / "ltx25" / "train_stage0p5_fm_153f.yaml"
H3 = TINY / "minimax_h3" / "train_stage0p5_fm_158f.yaml"
H3_INFER = TINY / "minimax_h3" / "infer_stage0p5_fm_158f.yaml"
BASE = ["data.root=/data", "runtime.output_dir=/out"]

CASES = {
    "a14b-stage1": (A14B, ["train.stage=stage1", "train.causal_mode=teacher_forcing",
                           "train.objective=anyflow_forward_map", "train.objective_variant=v1_5"],
                    "unsupported route wan22_i2v_a14b:stage1:teacher_forcing:anyflow_forward_map:v1_5"
                    " (from model.family, train.stage, train.causal_mode, train.objective, "
                    "train.objective_variant); wan22_i2v_a14b supports: "
                    "wan22_i2v_a14b:stage0p5:bidirectional:flow_matching"),
    "ltx-stage2": (LTX, ["train.stage=stage2", "train.causal_mode=self_gradient_forcing"],
                   "unsupported route ltx25_video:stage2:self_gradient_forcing:native_rectified_flow"),
    "h3-tf-fm": (H3, ["train.stage=stage1", "train.causal_mode=teacher_forcing"],
                 "unsupported route minimax_h3:stage1:teacher_forcing:flow_matching"),
    "wan-stage1-153f": (WAN_S1, ["data.pixel_frames=153"],
                        "data.pixel_frames=153 is outside the wan22_ti2v_5b stage1 frame profile; use 81"),
    "h3-linear": (H3, ["model.camera_translation_transform=linear"],
                  "model.camera_translation_transform=linear: minimax_h3 requires logd4"),
    "family-typo": (WAN_FM, ["model.family=wan22_ti2v5b"],
                    "model.family: must be one of 'wan22_ti2v_5b', 'wan22_i2v_a14b', 'ltx25_video' or 'minimax_h3'; "
                    "got 'wan22_ti2v5b' (did you mean wan22_ti2v_5b?)"),
    "transform-unknown": (WAN_FM, ["model.camera_translation_transform=log"],
                          "model.camera_translation_transform: must be one of 'linear' or 'logd4'; got 'log'"),
    "sp-not-dividing-world": (WAN_FM, ["distributed.world_size=6", "distributed.sequence_parallel_size=4"],
                              "distributed.world_size=6 is not divisible by distributed.sequence_parallel_size=4"),
    "global-batch-disagrees": (WAN_FM, ["distributed.world_size=4", "train.global_batch_size=8"],
                               "train.global_batch_size=8 disagrees with logical_dp_world_size 4 "
                               "(world 4 / SP 1) x train.micro_batch_size 1 x "
                               "train.gradient_accumulation 1 = 4; set train.global_batch_size=4"),
    "sp-not-dividing-heads": (WAN_FM, ["distributed.world_size=3", "distributed.sequence_parallel_size=3",
                                       "train.global_batch_size=1"],
                              "distributed.sequence_parallel_size=3 does not divide the 4 attention "
                              "heads of wan22_ti2v_5b (tiny); use one of 1, 2, 4"),
    "sp-not-dividing-released-heads": (
        CONFIGS / "wan22_i2v_a14b" / "train_stage0p5_fm_81f.yaml",
        ["distributed.sequence_parallel_size=16", "train.global_batch_size=16"],
        "does not divide the 40 attention heads of wan22_i2v_a14b (released); use one of 1, 2, 4, 5, 8,"),
    "h3-sp-rule": (H3, ["distributed.sequence_parallel_size=1", "distributed.world_size=2",
                        "train.global_batch_size=2"],
                   "minimax_h3 stage0p5 train requires sequence parallelism 2"),
    "h3-anchor-level": (H3, ["train.fm.keyframe_anchor_t=0.99"],
                        "train.fm.keyframe_anchor_t=0.99: the MiniMax-H3 model embeds its keyframe anchor at "
                        "t = 0.999; use 0.999 or leave it unset"),
    "h3-decode-latents": (H3, ["validation.decode_latents=2"],
                          "validation.decode_latents=2: the minimax_h3 codec decodes 5n+2 latents with n >= 1; "
                          "set 7, 12, 17, ..."),
    "h3-audio-loss": (H3, ["train.fm.audio_loss_weight=0.5"],
                      "train.fm.audio_loss_weight=0.5: MiniMax-H3 training has no audio loss"),
    "ltx-timestep-sampling": (LTX, ["train.fm.timestep_sampling=uniform"],
                              "train.fm.timestep_sampling='uniform': LTX-2.5 draws shifted logit-normal timesteps"),
    "ltx-weighting": (LTX, ["train.fm.weighting=gaussian"],
                      "train.fm.weighting='gaussian': LTX-2.5 weights every timestep alike"),
    "inline-token": (WAN_FM, ["metadata.hf_token=sekrit-value-123"],
                     "inline credential at metadata.hf_token"),
    "inline-password-case": (WAN_FM, ["data.Password=sekrit-value-123"],
                             "inline credential at data.Password"),
    "url-credentials": (WAN_FM, ["data.root=s3://user:sekrit-value-123@bucket/x"],
                        "inline credential at data.root (credentials in a URL)"),
    "unknown-key": (WAN_FM, ["train.micro_batch=2"],
                    "train.micro_batch: unknown key (did you mean train.micro_batch_size?)"),
    "unknown-top-level": (WAN_FM, ["trainer.x=1"], "trainer: unknown key (did you mean train?)"),
    "nan-set": (WAN_FM, ["train.optimizer.lr=.nan"], "--set train.optimizer.lr:1: non-finite number"),
    "unset-var": (WAN_FM, ["data.root=${SOLAR_TEST_SURELY_UNSET}"],
                  "data.root: environment variable ${SOLAR_TEST_SURELY_UNSET} is not set"),
    "through-non-mapping": (WAN_FM, ["model.family.x=1"], "model.family is a string, not a mapping"),
    "string-int": (WAN_FM, ["distributed.world_size='2'"],
                   "distributed.world_size: input should be a valid integer; got the string '2' (it was quoted); "
                   "write the number without quotes, e.g. --set distributed.world_size=2"),
    "string-float-yaml12": (WAN_FM, ['train.optimizer.lr="1e-4"'],
                            "got the string '1e-4' (it was quoted); write the number without quotes, e.g. "
                            "--set train.optimizer.lr=1e-4"),
    "string-bool": (WAN_FM, ['runtime.compile="true"'],
                    "got the string 'true' (it was quoted); write the boolean without quotes"),
    "string-not-a-number": (WAN_FM, ["train.max_steps=four"],
                            "train.max_steps: input should be a valid integer; got the string 'four'"),
    "infer-with-train-field": (H3_INFER, ["train.global_batch_size=4", "checkpoint.path=/c"],
                               "train.global_batch_size: a training setting that an inference run does "
                               "not read"),
    "ltx-infer-wrong-count-field": (TINY / "ltx25" / "infer_stage0p5_fm_153f.yaml",
                                    ["validation.sample_count=4", "checkpoint.path=/c"],
                                    "validation.sample_count: ltx25_video inference reads "
                                    "inference.sample_count"),
    "anyflow-block-on-stage0p5": (WAN_FM, ["train.anyflow.diffusion_ratio=0.5"],
                                  "train.anyflow: route wan22_ti2v_5b:stage0p5:bidirectional:"
                                  "flow_matching is not an AnyFlow route; remove it"),
    "fm-field-of-other-family": (WAN_FM, ["train.fm.keyframe_anchor_t=0.9"],
                                 "train.fm.keyframe_anchor_t: not a wan22_ti2v_5b setting"),
    "roles-on-stage0p5": (WAN_FM, ["checkpoint.mode=roles"], "checkpoint.mode=roles: only Stage2 has roles"),
    "weights-only-needs-path": (WAN_FM, ["checkpoint.mode=weights_only"],
                                "checkpoint.path: required for checkpoint.mode=weights_only"),
    "solver-of-other-route": (WAN_FM, ["validation.passes=[{name: a, weights: live, solver: flowmap, steps: 4}]"],
                              "validation.passes.0.solver=flowmap: route wan22_ti2v_5b:stage0p5:"
                              "bidirectional:flow_matching generates with unipc or euler"),
    "height-not-multiple": (WAN_FM, ["data.height=72"],
                            "data.height=72 must be a multiple of 32 for wan22_ti2v_5b (VAE x16, patch 2)"),
    "save-step-beyond-max": (WAN_FM, ["runtime.save_steps=[99]"],
                             "runtime.save_steps contains 99 > train.max_steps=4"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejection(case, cli, tmp_path):
    path, sets, fragment = CASES[case]
    line = refused_line(cli, path, [*BASE, *sets], tmp_path)
    assert fragment in line
    assert "sekrit" not in line


@pytest.mark.parametrize("text, fragment", [
    ("schema: solar.run.v1\naction: train\naction: infer\n", "cfg.yaml:3: duplicate key 'action'"),
    ("schema: solar.run.v1\n1: x\n", "mapping key 1 is not a string"),
    ("schema: solar.run.v1\nbogus: 1\n", "bogus: unknown key"),
    ("schema: solar.run.v2\n", "schema: must be one of 'solar.run.v1'"),
    ("schema: solar.run.v1\n", "required keys are missing: action, name, model, data, distributed, "
                               "train, runtime"),
    ('{"schema": "solar.run.v1", "x": NaN}', "non-finite number NaN"),
])
def test_document_rejections(text, fragment, cli, tmp_path):
    suffix = ".json" if text.startswith("{") else ".yaml"
    path = tmp_path / f"cfg{suffix}"
    path.write_text(text)
    result = cli("config", "resolve", "--config", str(path))
    assert result.code == 2
    assert fragment in result.err and result.err.count("\n") == 1


def test_action_mismatch_is_rejected():
    from solar.config.resolve import resolve_file
    from solar.errors import ConfigError

    with pytest.raises(ConfigError, match=r"the config says action 'infer' but the command is "
                                          r"`solar train`"):
        resolve_file(H3_INFER, ["data.root=/d", "runtime.output_dir=/o", "checkpoint.path=/c"],
                     expected_action="train")
    with pytest.raises(ConfigError, match="route wan22_ti2v_5b:stage1:teacher_forcing:flow_matching "
                                          "supports only train, not infer"):
        resolve_file(TINY / "wan22_ti2v_5b" / "train_stage1_tf_fm_81f.yaml",
                     [*BASE, "action=infer", "train.max_steps=", "train.micro_batch_size=",
                      "train.gradient_accumulation=", "train.global_batch_size=", "train.seed=",
                      "train.optimizer=", "train.ema=", "train.fm=", "runtime.save_every=0",
                      "checkpoint.mode=", "checkpoint.path=/c"])
