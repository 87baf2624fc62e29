"""Which W&B server the key check and the network probe look at (WANDB_BASE_URL)."""

from __future__ import annotations

import pytest

from hpc_harness import metrics


@pytest.mark.parametrize(
    "base_url, server",
    [
        (None, ("api.wandb.ai", 443)),
        ("", ("api.wandb.ai", 443)),
        ("http://wandb.lab.example", ("wandb.lab.example", 80)),
        ("HTTP://Wandb.Lab.Example", ("wandb.lab.example", 80)),
        ("https://wandb.lab.example", ("wandb.lab.example", 443)),
        ("http://wandb.lab.example:8080/", ("wandb.lab.example", 8080)),
        ("https://wandb.lab.example:notaport", ("wandb.lab.example", 443)),
        ("http://wandb.lab.example:notaport", ("wandb.lab.example", 80)),
        ("not a url", ("api.wandb.ai", 443)),
    ],
)
def test_server_from_wandb_base_url(monkeypatch, base_url, server) -> None:
    if base_url is None:
        monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    else:
        monkeypatch.setenv("WANDB_BASE_URL", base_url)
    assert metrics.wandb_server() == server


def test_the_network_probe_asks_that_server_and_waits_at_most_3_s(monkeypatch) -> None:
    import socket

    calls: list[tuple] = []

    def unreachable(address, timeout=None):  # noqa: ANN001, ANN202
        calls.append((address, timeout))
        raise OSError("no route")

    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.lab.example:8080")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    assert metrics.resolve_wandb_mode("online") == (
        "offline",
        "wandb.lab.example:8080 not reachable",
    )
    assert calls == [(("wandb.lab.example", 8080), 3.0)]
