"""resolve_wandb_mode's exact (mode, reason) for each request, wandb installed or not, key or
none, server reachable or not (all faked: no network, no real wandb needed); what
MetricsLogger writes to its CSV and prints when wandb was asked for but stays off; and that
the precision probe and scaler are built for the device asked about."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FakeRun, JobLog
from test_metrics import log  # noqa: F401  (a fixture)

from hpc_harness import metrics, precision

REAL_FIND_SPEC = importlib.util.find_spec
KEY = "k" * 40
PROXY_VARIABLES = [f"{name}_proxy" for name in ("http", "https", "all", "no")]
PROXY_VARIABLES += [name.upper() for name in PROXY_VARIABLES]


class Probe:
    """Stands in for socket.create_connection: records each call; reachable or not."""

    def __init__(self, reachable: bool) -> None:
        self.reachable = reachable
        self.calls: list[tuple[Any, Any]] = []

    def __call__(self, address: Any, timeout: Any = None) -> Any:
        self.calls.append((address, timeout))
        if not self.reachable:
            raise OSError("no route to host")
        return socket.socket()  # closed by the caller


@pytest.fixture
def wandb_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No key, no HPC_WANDB, the default server, an empty HOME (no netrc); returns HOME."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "HPC_WANDB", "WANDB_MODE", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    return home


def fake_wandb_installed(monkeypatch: pytest.MonkeyPatch, installed: bool) -> list[str]:
    """importlib.util.find_spec answers for "wandb" as asked; returns the names looked up."""
    looked_up: list[str] = []

    def find_spec(name: str, package: str | None = None) -> Any:
        looked_up.append(name)
        if name == "wandb":
            return importlib.machinery.ModuleSpec("wandb", None) if installed else None
        return REAL_FIND_SPEC(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return looked_up


def fake_network(monkeypatch: pytest.MonkeyPatch, reachable: bool) -> Probe:
    probe = Probe(reachable)
    monkeypatch.setattr(socket, "create_connection", probe)
    return probe


# --------------------------------------------------------------------------- resolve_wandb_mode


@pytest.mark.parametrize("installed", [True, False])
def test_disabled_is_disabled_as_requested_without_looking_for_wandb(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path, installed: bool
) -> None:
    """--wandb disabled (argument or HPC_WANDB): ("disabled", "requested"), wandb installed or
    not, and wandb is not even looked for."""
    looked_up = fake_wandb_installed(monkeypatch, installed)
    probe = fake_network(monkeypatch, reachable=True)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    assert metrics.resolve_wandb_mode("disabled") == ("disabled", "requested")
    monkeypatch.setenv("HPC_WANDB", "disabled")
    assert metrics.resolve_wandb_mode(None) == ("disabled", "requested")
    assert metrics.resolve_wandb_mode("") == ("disabled", "requested")
    assert "wandb" not in looked_up and probe.calls == []


@pytest.mark.parametrize("requested", ["auto", "online", "offline", None])
def test_without_wandb_installed_every_mode_is_disabled_and_says_so(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path, requested: str | None
) -> None:
    """wandb not importable: ("disabled", "wandb is not installed") for any mode but disabled,
    even with a key and a reachable server (which is then not probed)."""
    fake_wandb_installed(monkeypatch, installed=False)
    probe = fake_network(monkeypatch, reachable=True)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    assert metrics.resolve_wandb_mode(requested) == ("disabled", "wandb is not installed")
    assert probe.calls == []


def test_auto_without_a_key_is_disabled_but_online_falls_back_to_offline(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path
) -> None:
    """No WANDB_API_KEY and no netrc: auto (the default) is disabled, online goes offline,
    offline stays offline; nothing is probed."""
    fake_wandb_installed(monkeypatch, installed=True)
    probe = fake_network(monkeypatch, reachable=True)
    assert metrics.resolve_wandb_mode("auto") == ("disabled", "auto: no wandb API key")
    assert metrics.resolve_wandb_mode(None) == ("disabled", "auto: no wandb API key")
    assert metrics.resolve_wandb_mode("online") == ("offline", "no wandb API key")
    assert metrics.resolve_wandb_mode("offline") == ("offline", "requested")
    assert probe.calls == []


@pytest.mark.parametrize("key_from", ["env", "netrc"])
@pytest.mark.parametrize("requested", ["auto", "online"])
def test_with_a_key_and_the_server_reachable_the_run_is_online(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path, key_from: str, requested: str
) -> None:
    """A key (WANDB_API_KEY or a netrc entry for api.wandb.ai) and api.wandb.ai:443 answering
    within 3 s: ("online", "requested")."""
    fake_wandb_installed(monkeypatch, installed=True)
    probe = fake_network(monkeypatch, reachable=True)
    if key_from == "env":
        monkeypatch.setenv("WANDB_API_KEY", KEY)
    else:
        (wandb_env / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert metrics.resolve_wandb_mode(requested) == ("online", "requested")
    assert probe.calls == [(("api.wandb.ai", 443), 3.0)]


@pytest.mark.parametrize("requested", ["auto", "online"])
def test_an_unreachable_default_server_is_named_without_its_port(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path, requested: str
) -> None:
    """api.wandb.ai:443 not answering: offline, and the reason names the host alone; a
    self-hosted server (any other host or port) is named host:port."""
    fake_wandb_installed(monkeypatch, installed=True)
    probe = fake_network(monkeypatch, reachable=False)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    assert metrics.resolve_wandb_mode(requested) == ("offline", "api.wandb.ai not reachable")
    monkeypatch.setenv("WANDB_BASE_URL", "https://api.wandb.ai:8443")
    assert metrics.resolve_wandb_mode(requested) == (
        "offline",
        "api.wandb.ai:8443 not reachable",
    )
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.lab.example")
    assert metrics.resolve_wandb_mode(requested) == (
        "offline",
        "wandb.lab.example:443 not reachable",
    )
    assert probe.calls == [
        (("api.wandb.ai", 443), 3.0),
        (("api.wandb.ai", 8443), 3.0),
        (("wandb.lab.example", 443), 3.0),
    ]


def test_behind_a_proxy_the_probe_connects_to_the_proxy(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path
) -> None:
    """Compute nodes that reach the internet only through a proxy: wandb goes through
    HTTPS_PROXY (HTTP_PROXY for an http server), so the probe connects to it, not to the server
    (which it cannot reach, and the run went offline); a server in NO_PROXY is probed
    directly. An unreachable proxy is named in the reason."""
    fake_wandb_installed(monkeypatch, installed=True)
    probe = fake_network(monkeypatch, reachable=True)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.site:3128")
    assert metrics.resolve_wandb_mode("online") == ("online", "requested")
    monkeypatch.setenv("NO_PROXY", "api.wandb.ai")
    assert metrics.resolve_wandb_mode("online") == ("online", "requested")
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.setenv("WANDB_BASE_URL", "http://wandb.lab:8080")
    monkeypatch.setenv("HTTP_PROXY", "web-proxy:8000")  # without a scheme: http
    probe.reachable = False
    assert metrics.resolve_wandb_mode("online") == (
        "offline",
        "wandb.lab:8080 not reachable (through the proxy web-proxy:8000)",
    )
    monkeypatch.setenv("HTTP_PROXY", "http://web-proxy")  # an http proxy's default port
    assert metrics.resolve_wandb_mode("online")[1].endswith("(through the proxy web-proxy:80)")
    monkeypatch.setenv("HTTP_PROXY", "http://:3128")  # no host: named as it is, not made up
    assert metrics.resolve_wandb_mode("online")[1].endswith("(through the proxy :3128)")
    assert [address for address, _ in probe.calls][:4] == [
        ("proxy.site", 3128),
        ("api.wandb.ai", 443),
        ("web-proxy", 8000),
        ("web-proxy", 80),
    ]


@pytest.mark.parametrize(
    "hpc_wandb, expected",
    [
        ("offline", ("offline", "requested")),
        ("online", ("offline", "no wandb API key")),
        ("auto", ("disabled", "auto: no wandb API key")),
    ],
)
def test_hpc_wandb_sets_the_default_and_an_argument_overrides_it(
    monkeypatch: pytest.MonkeyPatch,
    wandb_env: Path,
    hpc_wandb: str,
    expected: tuple[str, str],
) -> None:
    """HPC_WANDB (exactly that name) is the mode when --wandb is not given; --wandb wins."""
    fake_wandb_installed(monkeypatch, installed=True)
    fake_network(monkeypatch, reachable=True)
    monkeypatch.setenv("HPC_WANDB", hpc_wandb)
    monkeypatch.setenv("hpc_wandb", "disabled")  # a lower-case name is another variable
    assert metrics.resolve_wandb_mode(None) == expected
    assert metrics.resolve_wandb_mode("disabled") == ("disabled", "requested")


@pytest.mark.parametrize(
    "wandb_mode, expected",
    [
        ("disabled", ("disabled", "auto: WANDB_MODE=disabled")),
        ("offline", ("offline", "auto: WANDB_MODE=offline")),
        ("dryrun", ("offline", "auto: WANDB_MODE=dryrun")),
        ("online", ("online", "requested")),
    ],
)
def test_auto_follows_a_wandb_mode_that_keeps_the_run_off_the_server(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path, wandb_mode: str, expected: tuple[str, str]
) -> None:
    """WANDB_MODE=disabled is how wandb users opt out (a site profile may set offline): with a
    key and the server reachable, auto went online anyway (wandb.init's mode= beats the
    variable). An explicit --wandb still wins."""
    fake_wandb_installed(monkeypatch, installed=True)
    probe = fake_network(monkeypatch, reachable=True)
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    monkeypatch.setenv("WANDB_MODE", wandb_mode)
    assert metrics.resolve_wandb_mode("auto") == expected
    assert len(probe.calls) == (wandb_mode == "online")  # no network probe when kept off it
    assert metrics.resolve_wandb_mode("online") == ("online", "requested")


@pytest.mark.parametrize("requested", ["bogus", "Disabled", "DISABLED"])
def test_an_unknown_mode_is_refused_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch, wandb_env: Path, requested: str
) -> None:
    """An unknown --wandb (or HPC_WANDB) value: ValueError with the choices and the value."""
    with pytest.raises(ValueError) as err:
        metrics.resolve_wandb_mode(requested)
    assert str(err.value) == (
        f"--wandb expects one of auto, online, offline, disabled, got '{requested}'"
    )
    monkeypatch.setenv("HPC_WANDB", requested)
    with pytest.raises(ValueError) as err:
        metrics.resolve_wandb_mode(None)
    assert str(err.value).endswith(f", disabled, got '{requested}'")


# --------------------------------------------------------------------------- MetricsLogger


def _csv_lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\r\n")


def test_the_csv_header_is_written_once_across_requeues(tmp_path: Path) -> None:
    """A new run folder gets the header; a requeued job appends rows without a second
    header; a metrics.csv that exists but is empty (a job killed at once) gets the header."""
    first = metrics.MetricsLogger(str(tmp_path), wandb_mode="disabled")
    first.log(1, 0, {"loss": 0.5})
    first.close()
    again = metrics.MetricsLogger(str(tmp_path), wandb_mode="disabled")
    again.log(2, 0, {"loss": 0.25})
    again.close()
    lines = _csv_lines(tmp_path / metrics.CSV_NAME)
    assert lines[0] == b"time,step,epoch,name,value"
    assert [line.split(b",", 1)[1] for line in lines[1:-1]] == [b"1,0,loss,0.5", b"2,0,loss,0.25"]
    assert lines[-1] == b""

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / metrics.CSV_NAME).write_bytes(b"")
    metrics.MetricsLogger(str(empty), wandb_mode="disabled").close()
    assert (empty / metrics.CSV_NAME).read_bytes() == b"time,step,epoch,name,value\r\n"


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_wandb_asked_for_but_not_installed_says_so_at_once(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    wandb_env: Path,
    log: JobLog,  # noqa: F811
    mode: str,
) -> None:
    """--wandb online/offline without wandb: one flushed line says why it is disabled."""
    fake_wandb_installed(monkeypatch, installed=False)
    logger = metrics.MetricsLogger(str(tmp_path), wandb_mode=mode)
    assert log.shown == "hpc_harness: wandb disabled (wandb is not installed)\n"
    assert logger.wandb_run is None
    logger.close()


@pytest.mark.parametrize("mode", ["auto", None, "disabled"])
def test_wandb_off_by_default_or_request_is_silent(
    tmp_path: Path,
    wandb_runs: list[FakeRun],
    log: JobLog,  # noqa: F811
    mode: str | None,
) -> None:
    """auto without a key, the default (None) and disabled: no wandb run and nothing printed
    (a stand-in wandb module is importable, so a run would be started if one were asked)."""
    logger = metrics.MetricsLogger(str(tmp_path), wandb_mode=mode)
    logger.close()
    assert wandb_runs == [] and logger.wandb_run is None
    assert log.getvalue() == ""
    assert not os.path.exists(tmp_path / "wandb_run_id")


# --------------------------------------------------------------------------- precision


def test_the_fp16_probe_runs_the_layer_and_its_input_on_the_device_asked_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe moves its layer and builds its input on the device it is asked about (on a
    GPU, a layer or input left on the CPU fails the probe and 16-mixed is refused). No GPU
    here: the probe runs on the CPU with Module.to and torch.ones spied on."""
    moved_to: list[Any] = []
    built_on: list[Any] = []
    real_to, real_ones = torch.nn.Module.to, torch.ones

    def to(self: torch.nn.Module, *args: Any, **kw: Any) -> torch.nn.Module:
        moved_to.append(args)
        return real_to(self, *args, **kw)

    def ones(*size: Any, **kw: Any) -> torch.Tensor:
        built_on.append(kw.get("device", "<no device given>"))
        return real_ones(*size, **kw)

    monkeypatch.setattr(torch.nn.Module, "to", to)
    monkeypatch.setattr(torch, "ones", ones)
    assert precision._fp16_works("cpu") is True
    assert moved_to == [("cpu",)]
    assert built_on == ["cpu"]


def test_the_fp16_scaler_belongs_to_the_device() -> None:
    """16-mixed's GradScaler is made for the run's device: a new scale given as a tensor on
    that device (GradScaler.update's public form) is accepted."""
    p = precision.make_precision("16-mixed", torch.device("cpu"))
    p.scaler.scale(torch.ones(()))
    p.scaler.update(torch.tensor(1024.0))
    assert p.scaler.get_scale() == 1024.0
