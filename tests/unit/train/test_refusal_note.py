"""The trainer's refusal left for Kubernetes (solar.launch.session.note_refusal): written to a
termination-message file that exists (the kubelet's), by each pod's local rank 0 only, never created."""

from __future__ import annotations

from solar.launch.session import note_refusal


def test_a_refusal_is_written_to_an_existing_termination_log_only(tmp_path):
    log = tmp_path / "termination-log"
    note_refusal("data.root /x\n does not exist", {"SOLAR_TERMINATION_LOG": str(log)})
    assert not log.exists()                       # a workstation: no file, none created
    log.write_text("")
    note_refusal("data.root /x\n does not exist", {"SOLAR_TERMINATION_LOG": str(log), "LOCAL_RANK": "1"})
    assert log.read_text() == ""                  # one line per pod, from its local rank 0
    note_refusal("data.root /x\n does not exist", {"SOLAR_TERMINATION_LOG": str(log), "LOCAL_RANK": "0"})
    assert log.read_text() == "solar: refused: data.root /x does not exist"
    note_refusal("y" * 10_000, {"SOLAR_TERMINATION_LOG": str(log)})
    assert len(log.read_text()) == 4000           # within the kubelet's 4096 bytes
