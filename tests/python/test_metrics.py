"""metrics.py: the wandb key check and network probe follow WANDB_BASE_URL (self-hosted W&B)."""

from __future__ import annotations

import socket

import pytest
from conftest import free_port

from hpc_harness import metrics


@pytest.fixture
def server():
    """A local TCP listener standing in for a self-hosted W&B server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_key_for_the_self_hosted_server_in_netrc_counts(tmp_path, monkeypatch, server) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server}")
    (tmp_path / ".netrc").write_text("machine 127.0.0.1\n  login user\n  password abc\n")
    assert metrics.resolve_wandb_mode("online") == ("online", "requested")
    assert metrics.resolve_wandb_mode("auto") == ("online", "requested")


def test_the_probe_goes_to_the_self_hosted_server(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    closed = free_port()
    monkeypatch.setenv("WANDB_BASE_URL", f"https://127.0.0.1:{closed}")
    assert metrics.resolve_wandb_mode("online") == (
        "offline",
        f"127.0.0.1:{closed} not reachable",
    )


def test_without_base_url_the_key_is_looked_up_for_api_wandb_ai(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert metrics._has_api_key()
    assert metrics.wandb_server() == ("api.wandb.ai", 443)
