"""`solar config resolve` expected to refuse: the one error line, after checking the contract's
shape of a refusal (exit 2, nothing on stdout, one line, no traceback, nothing written)."""

from __future__ import annotations


def resolve(cli, path, sets: list[str], tmp_path):
    """``solar config resolve --output tmp_path/resolved.json``: (its result, the output path)."""
    out = tmp_path / "resolved.json"
    argv = ["config", "resolve", "--config", str(path), "--output", str(out)]
    for item in sets:
        argv += ["--set", item]
    return cli(*argv), out


def refused_line(cli, path, sets: list[str], tmp_path) -> str:
    result, out = resolve(cli, path, sets, tmp_path)
    assert result.code == 2, result.err
    assert result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("solar: error: "), result.err
    assert "Traceback" not in result.err
    assert not out.exists() and list(tmp_path.iterdir()) == []
    return lines[0]
