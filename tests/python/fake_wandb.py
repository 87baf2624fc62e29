"""A fake W&B backend, just enough for the real ``wandb agent`` CLI to run a grid sweep.

Loopback only (127.0.0.1, an ephemeral port), standard library only, with a bounded
lifetime (it shuts itself down after ``lifetime`` seconds). The grid points come from
``python -m hpc_tools.trials --sweep FILE --list``, so an agent gets the same trials, in the
same order, as the array job built from the same file. The protocol (seen with wandb 0.31.0)
is described beside ``graphql``, preemption beside ``_run_ended``.

Run the agent against it (a 40-character dummy key; children inherit the agent's
environment, so WANDB_MODE=offline keeps their own wandb.init() off the network)::

    WANDB_BASE_URL=http://127.0.0.1:PORT WANDB_API_KEY=$(printf 'k%.0s' {1..40}) \\
    WANDB_MODE=offline wandb agent --count 1 fake/proj/SWEEP_ID

By hand: ``python tests/python/fake_wandb.py --sweep sweeper.yml`` prints the URL
and the sweep path, then serves until --lifetime runs out (default 600 s).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HPC_FILES = REPO / "hpc_files"  # the folder of the hpc_tools package
DUMMY_KEY = "k" * 40


class FakeWandb:
    """One sweep, handed out one grid point per run command, in manifest order."""

    def __init__(
        self,
        sweep_file: str | Path,
        *,
        api_key: str = DUMMY_KEY,
        entity: str = "fake",
        project: str = "proj",
        sweep_id: str = "fakesw01",
        lifetime: float = 300.0,
        offline_root: str | Path | None = None,
    ) -> None:
        import yaml

        text = Path(sweep_file).read_text(encoding="utf-8")
        self.config = yaml.safe_load(text)
        self.config_yaml = text
        self.points = self._points(sweep_file)
        self.api_key = api_key
        self.entity, self.project, self.sweep_id = entity, project, sweep_id
        self.lifetime = lifetime
        self.lock = threading.Lock()
        self.next_point = 0
        self.agents: dict[str, dict] = {}
        # run_id -> {"agent", "params", "alive", "state", "issued": [agent ids], "exit_code"}
        self.runs: dict[str, dict] = {}
        self.offline_root = Path(offline_root) if offline_root is not None else None
        self.requeue: list[str] = []  # preempted run ids, re-issued first, oldest first
        self.requests: list[str] = []  # operation names / paths, in arrival order
        self.server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    @staticmethod
    def _points(sweep_file: str | Path) -> list[dict]:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "hpc_tools.trials",
                "--prog",
                "fake_wandb",
                "--sweep",
                str(sweep_file),
                "--list",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(HPC_FILES)},
            check=False,
        )
        if proc.returncode != 0:
            raise ValueError(proc.stderr.strip())
        return [json.loads(line)["params"] for line in proc.stdout.splitlines()]

    # -- lifecycle ---------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def sweep_path(self) -> str:
        return f"{self.entity}/{self.project}/{self.sweep_id}"

    def start(self) -> FakeWandb:
        fake = self

        class Handler(_Handler):
            backend = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        serve = threading.Thread(target=self.server.serve_forever, daemon=True)
        serve.start()
        timer = threading.Timer(self.lifetime, self.stop)
        timer.daemon = True
        timer.start()
        self._threads = [serve]
        self._timer = timer
        return self

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()

    def __enter__(self) -> FakeWandb:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        """Environment for a ``wandb agent`` that talks to this fake."""
        return {
            "WANDB_BASE_URL": self.url,
            "WANDB_API_KEY": self.api_key,
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_ERROR_REPORTING": "false",
            "WANDB_AGENT_DISABLE_FLAPPING": "true",
        }

    # -- GraphQL -----------------------------------------------------------------
    # ``POST /graphql``: ``Viewer`` (login), ``SweepWithRuns`` (the agent reads the sweep's
    # ``config`` YAML for ``command``), ``CreateAgent``, then ``Heartbeat`` every ~5 s with
    # ``runState`` = JSON ``{run_id: true}`` for runs still alive. A heartbeat reply's
    # ``commands`` is a JSON string: ``[{"type": "run", "run_id", "program", "args":
    # {k: {"value": v}}}]``, ``[]`` (keep going) or ``[{"type": "exit"}]``.
    # ``POST /sdk/otel/v1/metrics`` (telemetry): a 200 is enough. Requests carry
    # ``Authorization: Basic base64("api:" + WANDB_API_KEY)``; a wrong key gets a 401.
    def graphql(self, operation: str, variables: dict) -> dict:
        with self.lock:
            self.requests.append(operation)
            if operation == "Viewer":
                return {
                    "viewer": {
                        "id": "VXNlcjox",
                        "entity": self.entity,
                        "username": self.entity,
                        "email": "fake@localhost",
                        "flags": "{}",
                        "teams": {"edges": []},
                    }
                }
            if operation == "SweepWithRuns":
                self._sync_runs()
                if variables.get("sweep") != self.sweep_id:
                    return {"project": None}
                return {"project": {"sweep": self._sweep()}}
            if operation == "CreateAgent":
                agent_id = f"agent-{len(self.agents) + 1}"
                self.agents[agent_id] = {"host": variables.get("host"), "runs": []}
                return {"createAgent": {"agent": {"id": agent_id}}}
            if operation == "Heartbeat":
                return {
                    "agentHeartbeat": {
                        "agent": {"id": variables.get("id")},
                        "commands": json.dumps(self._heartbeat(variables)),
                    }
                }
            return {}

    def _sweep(self) -> dict:
        runs = [
            {
                "node": {
                    "name": rid,
                    "state": r["state"],
                    "config": json.dumps({k: {"value": v} for k, v in r["params"].items()}),
                    "exitcode": r["exit_code"],
                    "heartbeatAt": None,
                    "shouldStop": False,
                    "failed": r["state"] == "failed",
                    "stopped": False,
                    "running": r["alive"],
                    "summaryMetrics": "{}",
                    "sampledHistory": [[]],
                }
            }
            for rid, r in self.runs.items()
        ]
        done = self.next_point >= len(self.points) and not self.requeue
        return {
            "id": "U3dlZXA6MQ==",
            "name": self.sweep_id,
            "method": self.config.get("method"),
            "state": "FINISHED" if done else "RUNNING",
            "description": None,
            "config": self.config_yaml,
            "createdAt": "2024-01-01T00:00:00",
            "heartbeatAt": None,
            "updatedAt": None,
            "earlyStopJobRunning": False,
            "bestLoss": None,
            "controller": None,
            "scheduler": None,
            "runs": {"edges": runs},
        }

    def _heartbeat(self, variables: dict) -> list[dict[str, Any]]:
        agent_id = variables.get("id")
        if agent_id not in self.agents:
            return [{"type": "exit"}]
        alive = json.loads(variables.get("runState") or "{}")
        for rid in self.agents[agent_id]["runs"]:
            run = self.runs[rid]
            if run["alive"] and run["agent"] == agent_id and not alive.get(rid):
                self._run_ended(rid)
        self._sync_runs()
        if any(alive.values()):
            return []
        if self.requeue:
            # A preempted run goes to the next agent that asks, before any new point.
            run_id = self.requeue.pop(0)
            run = self.runs[run_id]
            run.update(
                agent=agent_id, alive=True, state="running", exit_code=None, issued_at=time.time()
            )
            run["issued"].append(agent_id)
            self.agents[agent_id]["runs"].append(run_id)
            return [self._command("resume", run_id, run["params"])]
        if self.next_point >= len(self.points):
            return [{"type": "exit"}]
        params = self.points[self.next_point]
        self.next_point += 1
        run_id = f"fakerun{self.next_point:03d}"
        self.runs[run_id] = {
            "agent": agent_id,
            "params": params,
            "alive": True,
            "state": "running",
            "exit_code": None,
            "issued": [agent_id],
            "issued_at": time.time(),
        }
        self.agents[agent_id]["runs"].append(run_id)
        return [self._command("run", run_id, params)]

    def refresh(self) -> None:
        """Take in what the live runs recorded so far (the server hears it as they stream)."""
        with self.lock:
            self._sync_runs()

    def _sync_runs(self) -> None:
        # A run reports its own end (its exit record), also when its agent then stops
        # without another heartbeat (``--count 1``).
        for rid, run in self.runs.items():
            if run["alive"]:
                records = self._synced_records(rid)
                if records is not None and records["exit"] is not None:
                    self._run_ended(rid, records)

    def _command(self, kind: str, run_id: str, params: dict) -> dict[str, Any]:
        return {
            "type": kind,
            "run_id": run_id,
            "program": self.config.get("program"),
            "args": {k: {"value": v} for k, v in params.items()},
        }

    # Preemption, as W&B's sweeps do it (``wandb.mark_preempting()``; see the ``wandb_preempt``
    # package): a run tells the server it is *preempting*, then exits non-zero; the server marks
    # it *preempted* and hands the same run (same id, same parameters) to the next agent that
    # asks for work, before any new grid point. The agent treats that command (``"type":
    # "resume"``) like a ``run``: it sets ``WANDB_RUN_ID`` to the old id and starts the program
    # again. When an agent's heartbeat no longer lists a run as alive, the fake "syncs" that
    # run's records: it reads what the real server would have received from the run's own
    # record file (``run-<id>.wandb``, under ``offline_root``: the children run with
    # ``WANDB_MODE=offline``), and sets the run's state from them: a ``preempting`` record and a
    # non-zero exit code -> ``preempted`` (queued for re-issue), exit 0 -> ``finished``, another
    # exit code -> ``failed``; no record file -> ``finished`` (a program without wandb).
    def _run_ended(self, run_id: str, records: dict[str, Any] | None = None) -> None:
        """The run's process is gone: set its state from what it recorded (see above)."""
        run = self.runs[run_id]
        run["alive"] = False
        records = records or self._synced_records(run_id)
        if records is None:
            run["state"] = "finished"
            return
        exit_code = records.get("exit")
        run["exit_code"] = exit_code
        if records.get("preempting") and exit_code not in (None, 0):
            run["state"] = "preempted"
            self.requeue.append(run_id)
        elif exit_code == 0:
            run["state"] = "finished"
        else:
            run["state"] = "failed" if exit_code is not None else "crashed"

    def _synced_records(self, run_id: str) -> dict[str, Any] | None:
        """What the record file this issue of ``run_id`` wrote says (the newest one, written
        since the run was last handed out): {"preempting": bool, "exit": code or None}."""
        if self.offline_root is None:
            return None
        since = self.runs[run_id]["issued_at"]
        files = sorted(
            (
                f
                for f in self.offline_root.rglob(f"run-{run_id}.wandb")
                if f.stat().st_mtime >= since
            ),
            key=lambda f: f.stat().st_mtime,
        )
        if not files:
            return None
        found: dict[str, Any] = {"preempting": False, "exit": None}
        for record in read_records(files[-1]):
            kind = record.WhichOneof("record_type")
            if kind == "preempting":
                found["preempting"] = True
            elif kind == "exit":
                found["exit"] = record.exit.exit_code
        return found


def read_records(path: str | Path) -> list[Any]:
    """The protobuf records of a run's ``.wandb`` file (wandb's LevelDB-log format: a 7-byte
    header, 32 KiB blocks of chunks, each with a 7-byte header crc32/length/type)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    block, pos, pending = 32768, 7, b""
    out = []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):  # full, or last chunk of a record
            record = pb.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


class _Handler(BaseHTTPRequestHandler):
    backend: FakeWandb
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _reply(
        self, status: int, body: bytes = b"{}", content_type: str = "application/json"
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorised(self) -> bool:
        header = self.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        try:
            user_key = base64.b64decode(header[6:]).decode()
        except ValueError:
            return False
        return user_key.split(":", 1)[-1] == self.backend.api_key

    def do_GET(self) -> None:  # noqa: N802
        with self.backend.lock:
            self.backend.requests.append("GET " + self.path)
        self._reply(200)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.rstrip("/") != "/graphql":
            with self.backend.lock:
                self.backend.requests.append("POST " + self.path)
            self._reply(200)  # telemetry and anything else: accepted, ignored
            return
        if not self._authorised():
            self._reply(401, b'{"errors":[{"message":"invalid api key"}]}')
            return
        try:
            request = json.loads(body)
            query = request.get("query") or ""
            operation = request.get("operationName") or _operation_name(query)
            data = self.backend.graphql(operation, request.get("variables") or {})
        except (ValueError, AttributeError) as exc:
            self._reply(400, json.dumps({"errors": [{"message": str(exc)}]}).encode())
            return
        self._reply(200, json.dumps({"data": data}).encode())


def _operation_name(query: str) -> str:
    words = query.replace("(", " ").replace("{", " ").split()
    for i, word in enumerate(words[:-1]):
        if word in ("query", "mutation"):
            return words[i + 1]
    return ""


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="sweep file (grid or random)")
    parser.add_argument("--lifetime", type=float, default=600.0, help="seconds to serve")
    args = parser.parse_args(argv)
    with FakeWandb(args.sweep, lifetime=args.lifetime) as fake:
        print(
            f"WANDB_BASE_URL={fake.url} WANDB_API_KEY={fake.api_key} "
            f"wandb agent --count 1 {fake.sweep_path}",
            flush=True,
        )
        deadline = time.monotonic() + args.lifetime
        while fake.server is not None and time.monotonic() < deadline:
            time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
