#!/usr/bin/env python3
"""MCP interop: the official Python MCP SDK against a running agent-intercom.

Plays an IDE agent connected to /mcp?workspace_id=<ws> and, through the
operator HTTP API (/api, bearer token), the operator:

  1. tools/list has the eight agent-intercom tools;
  2. a blocking check_clearance is approved through POST /api/approvals/{id};
  3. check_diff applies the approved unified diff to the workspace file;
  4. steering sent with POST /api/sessions/{id}/prompt comes back from ping,
     once.

Exits 0 when everything holds; prints what failed otherwise. Uses only the
SDK's default connection mode ("auto": it probes server/discover and falls
back to the initialize handshake, which is what agent-intercom speaks).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = {
    "check_clearance",
    "check_diff",
    "auto_check",
    "transmit",
    "standby",
    "ping",
    "broadcast",
    "reboot",
}
WAIT_SECS = 30


class Failure(Exception):
    """An interop expectation did not hold."""


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


class Operator:
    """The operator side: the token-protected HTTP API."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base.rstrip("/")
        self.token = token

    def _call(self, method: str, path: str, body: Any | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise Failure(f"{method} {path}: HTTP {e.code}: {e.read().decode(errors='replace')}") from e
        return json.loads(raw) if raw else None

    async def pending(self) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_SECS
        while time.monotonic() < deadline:
            items = await anyio.to_thread.run_sync(self._call, "GET", "/api/approvals?status=pending")
            if items:
                return items[0]
            await anyio.sleep(0.1)
        raise Failure("no pending approval appeared in GET /api/approvals?status=pending")

    async def approve(self, approval_id: str) -> Any:
        return await anyio.to_thread.run_sync(
            self._call, "POST", f"/api/approvals/{approval_id}", {"decision": "approve"}
        )

    async def steer(self, session_id: str, text: str) -> Any:
        return await anyio.to_thread.run_sync(
            self._call, "POST", f"/api/sessions/{session_id}/prompt", {"text": text}
        )


def result_json(result: Any, tool: str) -> dict[str, Any]:
    expect(not result.is_error, f"{tool} returned a tool error: {result.content}")
    if isinstance(result.structured_content, dict):
        return result.structured_content
    text = next((c.text for c in result.content if getattr(c, "type", "") == "text"), None)
    expect(text is not None, f"{tool} returned no text content")
    return json.loads(text)


async def run(url: str, operator: Operator, workspace: Path) -> None:
    target = workspace / "hello.txt"
    target.write_text("hello\nworld\n")
    # /mcp wants the same bearer token as the operator API.
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {operator.token}"})
    async with Client(streamable_http_client(url, http_client=http)) as client:
        print(f"connected: protocol {client.protocol_version}")
        tools = await client.list_tools()
        names = {t.name for t in tools.tools}
        expect(names == TOOLS, f"tools/list gave {sorted(names)}, expected {sorted(TOOLS)}")
        print(f"ok: tools/list has {len(names)} tools")

        diff = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1,2 +1,2 @@\n hello\n-world\n+interop\n"
        outcome: dict[str, Any] = {}

        async def ask() -> None:
            r = await client.call_tool(
                "check_clearance",
                {"title": "Interop edit", "diff": diff, "file_path": "hello.txt", "risk_level": "low"},
            )
            outcome.update(result_json(r, "check_clearance"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            approval = await operator.pending()
            expect(approval["paths"] == ["hello.txt"], f"unexpected approval {approval}")
            expect(not outcome, "check_clearance returned before the operator decided")
            await operator.approve(approval["id"])
        expect(outcome.get("status") == "approved", f"check_clearance gave {outcome}")
        expect(outcome.get("request_id") == approval["id"], f"request ids differ: {outcome} vs {approval['id']}")
        print("ok: check_clearance blocked until approved through the operator API")

        applied = result_json(await client.call_tool("check_diff", {"request_id": outcome["request_id"]}), "check_diff")
        expect(applied.get("files_written") == ["hello.txt"], f"check_diff gave {applied}")
        content = target.read_text()
        expect(content == "hello\ninterop\n", f"hello.txt is {content!r}")
        print("ok: check_diff applied the approved diff")

        accepted = await operator.steer(approval["session_id"], "please also update the docs")
        expect(accepted.get("queued") is True, f"prompt was not queued: {accepted}")
        first = result_json(await client.call_tool("ping", {"status_message": "interop running"}), "ping")
        expect(
            first.get("queued_steering") == ["please also update the docs"],
            f"ping gave {first}",
        )
        second = result_json(await client.call_tool("ping", {}), "ping")
        expect(second.get("queued_steering") == [], f"second ping gave {second}")
        print("ok: ping returned the queued steering once")


def leaves(e: BaseException) -> list[BaseException]:
    """The exceptions inside (possibly nested) exception groups."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for inner in e.exceptions for leaf in leaves(inner)]
    return [e]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="MCP URL, e.g. http://127.0.0.1:3000/mcp?workspace_id=ws")
    ap.add_argument("--api", required=True, help="server base URL, e.g. http://127.0.0.1:3000")
    ap.add_argument("--token", required=True, help="operator API bearer token")
    ap.add_argument("--workspace", required=True, type=Path, help="the workspace directory")
    a = ap.parse_args()
    async def bounded() -> None:
        with anyio.fail_after(120):
            await run(a.url, Operator(a.api, a.token), a.workspace)

    try:
        anyio.run(bounded)
    except BaseException as e:  # noqa: BLE001 - report anything, task groups wrap errors
        for leaf in leaves(e):
            if isinstance(leaf, Failure):
                print(f"FAIL: {leaf}", file=sys.stderr)
            elif isinstance(leaf, TimeoutError):
                print("FAIL: the interop run took longer than 120 s", file=sys.stderr)
            else:
                print(f"FAIL: {type(leaf).__name__}: {leaf}", file=sys.stderr)
        return 1
    print("PASS: python mcp client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
