"""Index reading: every contract check, one-line errors naming the row, inspect."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest

from solar.data.index import inspect, iter_lines, load_table
from solar.errors import DataError
from tests.unit.data.helpers import rows, write_index


def test_reads_jsonl_and_gz_alike(tmp_path):
    items = rows(7, repeats={2: 3}, num_frames=153)
    plain = load_table(write_index(tmp_path / "i.jsonl", items))
    packed = load_table(write_index(tmp_path / "i.jsonl.gz", items))
    assert plain.rows == packed.rows == 7
    assert plain.virtual_occurrences == 9
    assert plain.sample_id_digest == packed.sample_id_digest
    assert plain.content_digest == packed.content_digest
    assert list(plain.repeats) == [1, 1, 3, 1, 1, 1, 1]
    assert plain.shards == ["shards/0000.tar", "shards/0001.tar", "shards/0002.tar"]


def test_blank_lines_are_skipped_and_lines_counted(tmp_path):
    path = write_index(tmp_path / "i.jsonl", [rows(1)[0], "", "   ", rows(2)[1]])
    table = load_table(path)
    assert table.rows == 2 and list(table.lines) == [1, 4]


BAD = {
    "duplicate id": ([{"sample_id": "a", "key": "1", "shard": "s.tar"}, {"sample_id": "b", "key": "2", "shard": "s.tar"},
                      {"sample_id": "a", "key": "3", "shard": "s.tar"}],
                     ":3: duplicate sample_id 'a' (first at line 1)"),
    "parent segment": ([{"sample_id": "a", "key": "1", "shard": "../x.tar"}],
                       ":1 (sample_id 'a'): shard '../x.tar' has a '..' segment"),
    "absolute": ([{"sample_id": "a", "key": "1", "shard": "/etc/x.tar"}],
                 ":1 (sample_id 'a'): shard '/etc/x.tar' is absolute"),
    "scheme": ([{"sample_id": "a", "key": "1", "shard": "gs://b/x.tar"}], "has a URL scheme"),
    "backslash": ([{"sample_id": "a", "key": "1", "shard": "a\\x.tar"}], "contains a backslash"),
    "empty segment": ([{"sample_id": "a", "key": "1", "shard": "a//x.tar"}], "has an empty segment"),
    "dot segment": ([{"sample_id": "a", "key": "1", "shard": "./x.tar"}], "has a '.' segment"),
    "missing key": ([{"sample_id": "a", "shard": "x.tar"}], ":1 (sample_id 'a'): missing or empty required field key"),
    "missing id": ([{"key": "1", "shard": "x.tar"}], ":1: missing or empty required field sample_id"),
    "missing shard": ([{"sample_id": "a", "key": "1"}], "missing or empty required field shard"),
    "id not string": ([{"sample_id": 5, "key": "1", "shard": "x"}], "sample_id must be a string, got int"),
    "bad repeats": ([{"sample_id": "a", "key": "1", "shard": "x", "epoch_repeats": 0}],
                    "epoch_repeats must be an integer >= 1, got 0"),
    "bool repeats": ([{"sample_id": "a", "key": "1", "shard": "x", "epoch_repeats": True}],
                     "epoch_repeats must be an integer >= 1, got True"),
    "bad fps": ([{"sample_id": "a", "key": "1", "shard": "x", "fps": -1}], "fps must be a positive number"),
    "start past end": ([{"sample_id": "a", "key": "1", "shard": "x", "num_frames": 5, "start_frame": 5}],
                       "start_frame 5 is not below num_frames 5"),
    "unknown family": ([{"sample_id": "a", "key": "1", "shard": "x", "family": "sora"}],
                       "family 'sora' is not a known family"),
    "half offsets": ([{"sample_id": "a", "key": "1", "shard": "x", "member_offset": 512}],
                     "member_offset and member_size come together"),
    "not an object": (["[1, 2]"], ":1: row is a list, expected a JSON object"),
    "invalid json": (['{"sample_id": "a", '], ":1: invalid JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_index(case, tmp_path, cli):
    items, fragment = BAD[case]
    path = write_index(tmp_path / "bad.jsonl", items)
    with pytest.raises(DataError) as info:
        load_table(path)
    assert fragment in str(info.value) and str(path) in str(info.value)
    result = cli("data", "inspect", str(path))
    assert result.code == 2 and result.err.count("\n") == 1 and fragment in result.err


def test_truncated_gzip(tmp_path, cli):
    text = "".join(json.dumps(r) + "\n" for r in rows(3000, caption="a clip"))
    good = gzip.compress(text.encode(), mtime=0)
    cut = good[: len(good) // 2]
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(cut)
    # Independently: what a decompressor recovers from the cut stream, and its complete lines.
    recovered = zlib.decompressobj(wbits=31).decompress(cut)
    last = recovered.count(b"\n")
    assert 1000 < last < 3000  # far beyond any read-ahead buffer's worth, and not the whole file
    message = (f"{path}: corrupt or truncated gzip stream after line {last} "
               "(Compressed file ended before the end-of-stream marker was reached); the index is incomplete")
    with pytest.raises(DataError) as info:
        load_table(path)
    assert str(info.value) == message
    seen = []
    with pytest.raises(DataError, match=rf"after line {last} "):
        for number, _ in iter_lines(path):
            seen.append(number)
    assert seen == list(range(1, last + 1))  # every complete line read is handed out before the error
    result = cli("data", "inspect", str(path))
    assert result.code == 2 and result.out == ""
    assert result.err == f"solar: error: {message}\n"
    result = cli("data", "plan", str(path), "--seed", "1", "--pixel-frames", "1", "--world-size", "1",
                 "--rank", "0")
    assert result.code == 2 and result.err == f"solar: error: {message}\n"


def test_empty_index(tmp_path):
    with pytest.raises(DataError, match="has no rows"):
        load_table(write_index(tmp_path / "e.jsonl", [""]))


def test_inspect_reports_shard_problems(tmp_path, monkeypatch):
    root = tmp_path / "data"
    (root / "shards").mkdir(parents=True)
    (root / "shards" / "0000.tar").write_bytes(b"x" * 10)
    (root / "shards" / "0001.tar").write_bytes(b"x" * 7)
    (tmp_path / "outside.tar").write_bytes(b"y")
    (root / "shards" / "0003.tar").symlink_to(tmp_path / "outside.tar")
    items = rows(12, per_shard=3)
    for item in items[:3]:
        item["shard_size"] = 10
    for item in items[3:6]:
        item["shard_size"] = 8
    write_index(root / "index.jsonl", items)
    report = inspect(root / "index.jsonl")
    assert report["rows"] == 12 and report["shards"] == 4 and report["problem_count"] == 3
    assert report["problems"] == [
        "shard shards/0001.tar: size 7 bytes, index declares 8",
        f"shard shards/0002.tar: missing under {root}",
        f"shard shards/0003.tar: resolves outside the data root {root} (via a symlink)",
    ]
    assert set(report) >= {"index", "rows", "virtual_occurrences", "fields", "problems",
                           "ordered_sample_id_digest"}
    assert "families" not in report
    monkeypatch.setenv("SOLAR_DATA_ROOT", str(tmp_path / "nowhere"))
    assert inspect(root / "index.jsonl")["problems"][0].startswith("data root")


def test_inspect_counts_fields_and_families(tmp_path, cli):
    items = rows(4, family="wan2.2-ti2v-5b", num_frames=81)
    items[0]["caption"] = "hello"
    path = write_index(tmp_path / "i.jsonl.gz", items)
    result = cli("data", "inspect", str(path))
    assert result.code == 0
    report = json.loads(result.out)
    assert report["families"] == {"wan22_ti2v_5b": 4}
    assert report["fields"]["caption"] == 1 and report["fields"]["sample_id"] == 4
    assert len(report["ordered_sample_id_digest"]) == 64
