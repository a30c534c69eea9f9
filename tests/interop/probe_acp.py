#!/usr/bin/env python3
"""Probe a real Agent Client Protocol (ACP) agent over NDJSON stdio.

Stdlib only. Spawns the agent command with a cleared environment, then runs:

    initialize -> session/new -> session/prompt("hello")

printing every stdout/stderr line with a timestamp (seconds since spawn),
answering agent->client requests (fs/read_text_file, fs/write_text_file,
session/request_permission; -32601 for anything else), then closes stdin and
reports whether the agent exits on its own within --eof-wait seconds, and
finally kills its whole process group.

Usage:
    probe_acp.py [options] -- COMMAND [ARGS...]

Examples:
    python3 tests/interop/probe_acp.py -- tests/interop/node_modules/.bin/claude-code-acp
    python3 tests/interop/probe_acp.py -- tests/interop/node_modules/.bin/gemini --acp

A machine-readable summary is printed as the last line ("SUMMARY {...}") and
optionally written to --summary FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

INIT_PARAMS = {
    "protocolVersion": 1,
    "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}},
    "clientInfo": {"name": "agent-intercom", "version": "0.1.0"},
}


class Probe:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.q: "queue.Queue[tuple[str, float, str | None]]" = queue.Queue()
        self.next_id = 0
        self.proc: subprocess.Popen | None = None
        self.wlock = threading.Lock()
        self.summary: dict = {
            "command": args.command,
            "env": {},
            "steps": {},
            "notifications": [],
            "agent_requests": [],
            "stderr": [],
            "non_json_stdout": [],
        }
        self.tmp_home: str | None = None  # created (and removed) by us unless --home
        self.cwd = tempfile.mkdtemp(prefix="acp-probe-cwd-")
        with open(os.path.join(self.cwd, "README.md"), "w") as f:
            f.write("probe workspace\n")

    # ---------------------------------------------------------------- output
    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, tag: str, text: str, at: float | None = None) -> None:
        at = self.now() if at is None else at
        print(f"[{at:8.3f}s] {tag} {text}", flush=True)

    # ------------------------------------------------------------- process
    def build_env(self) -> dict:
        home = self.args.home
        if home is None:
            home = self.tmp_home = tempfile.mkdtemp(prefix="acp-probe-home-")
        env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": home}
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        cmd_text = " ".join(self.args.command)
        if self.args.sandbox == "yes" or (
            self.args.sandbox == "auto" and is_root and "claude-code-acp" in cmd_text
        ):
            env["IS_SANDBOX"] = "1"
        for kv in self.args.env:
            k, _, v = kv.partition("=")
            env[k] = v
        return env

    def spawn(self) -> None:
        env = self.build_env()
        self.summary["env"] = env
        cmd = list(self.args.command)
        if os.sep in cmd[0]:
            cmd[0] = os.path.abspath(cmd[0])  # the agent runs in the probe cwd
        else:
            cmd[0] = shutil.which(cmd[0], path=env["PATH"]) or cmd[0]
        self.log("**", f"spawn {cmd!r} cwd={self.cwd}")
        self.log("**", f"env {json.dumps(env, sort_keys=True)}")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.cwd,
            env=env,
            start_new_session=True,  # own process group -> killpg at the end
        )
        threading.Thread(target=self._pump, args=("out", self.proc.stdout), daemon=True).start()
        threading.Thread(target=self._pump, args=("err", self.proc.stderr), daemon=True).start()

    def _pump(self, kind: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.q.put((kind, self.now(), raw.decode("utf-8", "replace").rstrip("\r\n")))
        self.q.put((kind, self.now(), None))

    def send(self, msg: dict) -> None:
        line = json.dumps(msg, separators=(",", ":"))
        self.log("->", line)
        assert self.proc and self.proc.stdin
        try:
            with self.wlock:
                self.proc.stdin.write(line.encode() + b"\n")
                self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as e:
            self.log("!!", f"write failed: {e}")

    # ---------------------------------------------------- agent -> client
    def handle_agent_request(self, msg: dict) -> None:
        method = msg.get("method")
        params = msg.get("params") or {}
        self.summary["agent_requests"].append({"t": round(self.now(), 3), "msg": msg})
        rid = msg["id"]
        try:
            if method == "fs/read_text_file":
                path = params["path"]
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                line, limit = params.get("line"), params.get("limit")
                if line is not None or limit is not None:
                    lines = text.splitlines(keepends=True)
                    start = max((line or 1) - 1, 0)
                    end = start + limit if limit is not None else None
                    text = "".join(lines[start:end])
                self.send({"jsonrpc": "2.0", "id": rid, "result": {"content": text}})
            elif method == "fs/write_text_file":
                path = os.path.realpath(params["path"])
                if not path.startswith(os.path.realpath(self.cwd) + os.sep):
                    raise PermissionError(f"refusing write outside probe cwd: {path}")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(params["content"])
                self.send({"jsonrpc": "2.0", "id": rid, "result": None})
            elif method == "session/request_permission":
                self.send(
                    {"jsonrpc": "2.0", "id": rid, "result": {"outcome": {"outcome": "cancelled"}}}
                )
            else:
                self.send(
                    {
                        "jsonrpc": "2.0",
                        "id": rid,
                        "error": {"code": -32601, "message": f"Method not found: {method}"},
                    }
                )
        except Exception as e:  # noqa: BLE001 - probe answers with an error
            self.send(
                {"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": str(e)}}
            )

    # ---------------------------------------------------------- main loop
    def pump_until(self, want_id: int | None, timeout: float) -> tuple[str, dict | None]:
        """Process incoming lines until response `want_id` arrives.

        Returns ("response", msg) | ("timeout", None) | ("eof", None).
        With want_id None just drains for `timeout` seconds (or until EOF)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", None
            try:
                kind, at, line = self.q.get(timeout=left)
            except queue.Empty:
                return "timeout", None
            if line is None:
                self.log("**", f"{'stdout' if kind == 'out' else 'stderr'} EOF", at)
                if kind == "out":
                    return "eof", None
                continue
            if kind == "err":
                self.log("E:", line, at)
                self.summary["stderr"].append({"t": round(at, 3), "line": line})
                continue
            self.log("<-", line, at)
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                self.summary["non_json_stdout"].append({"t": round(at, 3), "line": line})
                continue
            if not isinstance(msg, dict):
                self.summary["non_json_stdout"].append({"t": round(at, 3), "line": line})
                continue
            if "method" in msg and "id" in msg:
                self.handle_agent_request(msg)
            elif "method" in msg:
                self.summary["notifications"].append({"t": round(at, 3), "msg": msg})
            elif msg.get("id") == want_id and want_id is not None:
                return "response", msg
            else:
                self.log("**", f"unexpected response id={msg.get('id')!r}")

    def request(self, name: str, method: str, params: dict, timeout: float) -> dict | None:
        self.next_id += 1
        rid = self.next_id
        sent = self.now()
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        status, msg = self.pump_until(rid, timeout)
        elapsed = round(self.now() - sent, 3)
        step = {"status": status, "elapsed_s": elapsed, "sent_at_s": round(sent, 3)}
        if msg is not None:
            step["status"] = "error" if "error" in msg else "ok"
            step["response"] = msg
        self.summary["steps"][name] = step
        self.log("**", f"{name}: {step['status']} after {elapsed}s")
        return msg if msg is not None and "result" in msg else None

    def run(self) -> int:
        a = self.args
        self.spawn()
        try:
            init = self.request("initialize", "initialize", INIT_PARAMS, a.init_timeout)
            if init is not None and a.stop_after != "initialize":
                sess = self.request(
                    "session/new",
                    "session/new",
                    {"cwd": self.cwd, "mcpServers": []},
                    a.timeout,
                )
                if (
                    sess is not None
                    and "sessionId" in sess.get("result", {})
                    and a.stop_after != "session/new"
                ):
                    sid = sess["result"]["sessionId"]
                    if a.cancel_after is not None:
                        self._schedule_cancel(sid, a.cancel_after)
                    self.request(
                        "session/prompt",
                        "session/prompt",
                        {"sessionId": sid, "prompt": [{"type": "text", "text": a.prompt}]},
                        a.timeout,
                    )
            # Let trailing notifications/stderr arrive.
            self.pump_until(None, a.settle)
            # Close stdin and see whether the agent exits by itself.
            self.log("**", "closing stdin")
            closed_at = self.now()
            try:
                assert self.proc and self.proc.stdin
                self.proc.stdin.close()
            except OSError:
                pass
            exited = None
            deadline = time.monotonic() + a.eof_wait
            while time.monotonic() < deadline:
                # keep draining output so the child never blocks on a full pipe
                try:
                    kind, at, line = self.q.get(timeout=0.05)
                    if line is not None:
                        self.log("<-" if kind == "out" else "E:", line, at)
                        if kind == "err":
                            self.summary["stderr"].append({"t": round(at, 3), "line": line})
                except queue.Empty:
                    pass
                rc = self.proc.poll() if self.proc else None
                if rc is not None:
                    exited = rc
                    break
            took = round(self.now() - closed_at, 3)
            self.summary["exit_on_stdin_eof"] = {
                "exited": exited is not None,
                "returncode": exited,
                "after_s": took if exited is not None else None,
                "waited_s": a.eof_wait,
            }
            self.log(
                "**",
                f"exit on stdin EOF: {'yes rc=' + str(exited) + f' after {took}s' if exited is not None else f'NO (still running after {a.eof_wait}s)'}",
            )
        finally:
            self.kill_group()
            shutil.rmtree(self.cwd, ignore_errors=True)
            if self.tmp_home and not a.keep_home:
                shutil.rmtree(self.tmp_home, ignore_errors=True)
            elif self.tmp_home:
                self.log("**", f"kept HOME {self.tmp_home}")
        line = json.dumps(self.summary, sort_keys=True)
        if a.summary:
            with open(a.summary, "w") as f:
                json.dump(self.summary, f, indent=2, sort_keys=True)
                f.write("\n")
        if not a.summary:
            print("SUMMARY " + line, flush=True)
        return 0

    def _schedule_cancel(self, sid: str, delay: float) -> None:
        def fire() -> None:
            time.sleep(delay)
            self.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}})
            self.summary["cancel_sent_at_s"] = round(self.now(), 3)

        threading.Thread(target=fire, daemon=True).start()

    @staticmethod
    def group_members(pgid: int) -> list[dict]:
        """Processes (pid, ppid, cmdline) whose process group is `pgid` (Linux /proc)."""
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    stat = f.read().decode("utf-8", "replace")
                # fields after the parenthesised comm: state ppid pgrp ...
                rest = stat[stat.rindex(")") + 2 :].split()
                if rest[0] == "Z" or int(rest[2]) != pgid:
                    continue
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
                out.append({"pid": int(d), "ppid": int(rest[1]), "cmd": cmd[:200]})
            except (OSError, ValueError, IndexError):
                continue
        return sorted(out, key=lambda m: m["pid"])

    def kill_group(self) -> None:
        """Kill the agent. --kill group: SIGTERM then SIGKILL to the whole group;
        --kill leader-term / leader-kill: signal only the direct child, then report
        which processes of its group survive (and SIGKILL the group anyway)."""
        if not self.proc:
            return
        pgid = self.proc.pid
        members = self.group_members(pgid)
        self.summary["process_group_before_kill"] = members
        self.log("**", f"process group {pgid} before kill: {json.dumps(members)}")
        mode = self.args.kill
        report: dict = {"mode": mode}
        if mode != "group":
            sig = signal.SIGTERM if mode == "leader-term" else signal.SIGKILL
            try:
                os.kill(pgid, sig)
            except ProcessLookupError:
                pass
            time.sleep(2)
            report["leader_exited"] = self.proc.poll() is not None
            report["leader_returncode"] = self.proc.returncode
            report["survivors"] = self.group_members(pgid)
            self.log("**", f"after {sig.name} to leader only: {json.dumps(report)}")
        report["group_emptied_by"] = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                report["group_emptied_by"] = report["group_emptied_by"] or "already-empty"
                break
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and self.group_members(pgid):
                self.proc.poll()  # reap the leader if it died
                time.sleep(0.05)
            if not self.group_members(pgid):
                report["group_emptied_by"] = sig.name
                break
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        report["returncode"] = self.proc.returncode
        self.summary["kill"] = report
        self.log("**", f"kill: {json.dumps(report)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init-timeout", type=float, default=60.0, help="seconds to wait for initialize")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for session/new and session/prompt")
    p.add_argument("--settle", type=float, default=1.0, help="seconds to drain output before closing stdin")
    p.add_argument("--eof-wait", type=float, default=5.0, help="seconds to wait for exit after stdin EOF")
    p.add_argument("--home", default=None,
                   help="HOME for the agent (default: a fresh temp dir, removed afterwards)")
    p.add_argument("--keep-home", action="store_true", help="keep the temp HOME for inspection")
    p.add_argument("--sandbox", choices=("auto", "yes", "no"), default="auto",
                   help="set IS_SANDBOX=1 (auto: when root and command is claude-code-acp)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="extra env var (repeatable)")
    p.add_argument("--prompt", default="hello")
    p.add_argument("--kill", choices=("group", "leader-term", "leader-kill"), default="group",
                   help="how to stop the agent at the end (leader-*: signal only the direct "
                   "child first and report survivors, then kill the group)")
    p.add_argument("--stop-after", choices=("initialize", "session/new", "session/prompt"),
                   default="session/prompt", help="last request to send before closing stdin")
    p.add_argument("--cancel-after", type=float, default=None, metavar="SECONDS",
                   help="send a session/cancel notification this long after the prompt")
    p.add_argument("--summary", default=None, help="also write the JSON summary to this file")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("missing agent command (after --)")
    return Probe(args).run()


if __name__ == "__main__":
    sys.exit(main())
