"""The supported-route table and the example configs that exercise it."""

from __future__ import annotations

import json

from solar.config import families, routes
from solar.config.loader import read_document
from tests.conftest import CONFIGS, REPO

EXPECTED = {
    "wan22_ti2v_5b:stage0p5:bidirectional:flow_matching": ["train", "infer"],
    "wan22_ti2v_5b:stage1:teacher_forcing:flow_matching": ["train"],
    "wan22_ti2v_5b:stage1:teacher_forcing:anyflow_forward_map:v1_5": ["train", "infer"],
    "wan22_ti2v_5b:stage2:self_gradient_forcing:flow_matching": ["train", "infer"],
    "wan22_i2v_a14b:stage0p5:bidirectional:flow_matching": ["train", "infer"],
    "ltx25_video:stage0p5:bidirectional:native_rectified_flow": ["train", "infer"],
    "minimax_h3:stage0p5:bidirectional:flow_matching": ["train", "infer"],
    "minimax_h3:stage1:teacher_forcing:anyflow_forward_map:v1_5": ["train", "infer"],
    "minimax_h3:stage2:self_gradient_forcing:flow_matching": ["train", "infer"],
}

CONTRACT_FILES = {
    "wan22_ti2v_5b": {"train_stage0p5_fm_81f.yaml", "train_stage0p5_fm_153f.yaml",
                      "infer_stage0p5_fm_81f.yaml", "train_stage1_tf_fm_81f.yaml",
                      "train_stage1_tf_anyflow_81f.yaml", "infer_stage1_tf_anyflow_81f.yaml",
                      "train_stage2_sgf_81f.yaml", "infer_stage2_sgf_81f.yaml",
                      "infer_stage2_sgf_camera_length.yaml"},
    "wan22_i2v_a14b": {"train_stage0p5_fm_81f.yaml", "train_stage0p5_fm_153f.yaml",
                       "infer_stage0p5_fm_81f.yaml"},
    "ltx25": {"train_stage0p5_fm_153f.yaml", "infer_stage0p5_fm_153f.yaml"},
    "minimax_h3": {"train_stage0p5_fm_158f.yaml", "infer_stage0p5_fm_158f.yaml",
                   "train_stage1_tf_anyflow_158f.yaml", "infer_stage1_tf_anyflow_158f.yaml",
                   "train_stage2_sgf_158f.yaml", "infer_stage2_sgf_158f.yaml"},
}


def test_routes_json_lists_exactly_the_nine_routes(cli):
    result = cli("config", "routes", "--json")
    assert result.code == 0
    rows = json.loads(result.out)
    assert [row["route"] for row in rows] == sorted(EXPECTED)
    for row in rows:
        assert set(row) == {"route", "family", "stage", "causal_mode", "objective", "variant",
                            "actions", "configs"}
        assert row["actions"] == EXPECTED[row["route"]]
        key = ":".join([row["family"], row["stage"], row["causal_mode"], row["objective"]]
                       + ([row["variant"]] if row["variant"] else []))
        assert key == row["route"]
        assert row["configs"], row["route"]
        for path in row["configs"]:
            assert (REPO / path).is_file(), path


def test_routes_text_table(cli):
    result = cli("config", "routes")
    assert result.code == 0
    for key in EXPECTED:
        assert key in result.out
    assert "configs/solar_wm/minimax_h3/train_stage2_sgf_158f.yaml" in result.out


def test_contract_files_exist_released_and_tiny():
    for folder, names in CONTRACT_FILES.items():
        for scale in (CONFIGS / folder, CONFIGS / "tiny" / folder):
            present = {p.name for p in scale.glob("*.yaml")}
            assert names <= present, (scale, names - present)


def test_every_config_file_is_listed_by_the_route_it_declares():
    listed = {path: row["route"] for row in routes.table() for path in row["configs"]}
    on_disk = sorted(str(p.relative_to(REPO)) for p in CONFIGS.rglob("*.yaml"))
    assert sorted(listed) == on_disk
    for path, key in listed.items():
        _, tree = read_document(REPO / path)
        train = tree["train"]
        family = families.canonical_family(tree["model"]["family"])
        declared = ":".join([family, train["stage"], train["causal_mode"], train["objective"]]
                            + ([train["objective_variant"]] if train.get("objective_variant") else []))
        assert declared == key, path
        info = routes.lookup(routes.Route(*key.split(":") + [None] * (5 - len(key.split(":")))))
        assert tree["action"] in info.actions, path
