"""fail_closed: what each kind of hook refuses when our code raises (the e2e version is
tests/e2e/test_reliability.py::test_internal_error_fails_closed)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from mitmproxy import exceptions, options, tls
from mitmproxy.proxy import context, layer, server_hooks
from mitmproxy.test import tflow
from mitmproxy.test.tflow import tclient_conn, tserver_conn

from egress.addons import failsafe
from egress.addons.tunnel import RefuseLayer


class Broken:
    def __init__(self):
        self.calls = 0

    def requestheaders(self, flow):
        self.calls += 1
        raise KeyError("Bearer secret-value")

    async def http_connect(self, flow):
        raise ValueError("boom")

    def tls_clienthello(self, data):
        raise RuntimeError("boom")

    def server_connect(self, data):
        raise RuntimeError("boom")

    def client_connected(self, client):
        raise RuntimeError("boom")

    def client_disconnected(self, client):
        raise RuntimeError("boom")

    def configure(self, updated):
        raise RuntimeError("lifecycle errors must propagate")


def errors(hook: str) -> float:
    return failsafe.INTERNAL_ERRORS.labels(hook)._value.get()


def test_request_hook_answers_403_internal_error(caplog):
    addon = failsafe.fail_closed(Broken())
    flow = tflow.tflow()
    before = errors("requestheaders")
    addon.requestheaders(flow)
    assert flow.response.status_code == 403
    assert flow.response.headers["X-Egress-Denied"] == "internal_error"
    assert json.loads(flow.response.content) == {
        "error": "egress_denied", "reason": "internal_error", "host": flow.request.host,
    }  # fmt: skip
    assert errors("requestheaders") == before + 1
    [record] = [r for r in caplog.records if "internal error" in r.getMessage()]
    assert "Broken.requestheaders (KeyError at" in record.getMessage()
    assert "secret-value" not in record.getMessage()  # the exception's text is never logged


def test_async_hook_fails_closed_too():
    addon = failsafe.fail_closed(Broken())
    flow = tflow.tflow()
    asyncio.run(addon.http_connect(flow))
    assert flow.response.status_code == 403


def test_tls_clienthello_refuses_the_tunnel():
    addon = failsafe.fail_closed(Broken())
    ctx = context.Context(tclient_conn(), options.Options())
    data = tls.ClientHelloData(ctx, SimpleNamespace(sni="a.example.test"))
    addon.tls_clienthello(data)
    assert data.ignore_connection and ctx.server.error == "egress: internal_error"


def test_server_connect_and_client_connected_refuse():
    addon = failsafe.fail_closed(Broken())
    data = server_hooks.ServerConnectionHookData(server=tserver_conn(), client=tclient_conn())
    addon.server_connect(data)
    assert data.server.error == "egress: internal_error"
    client = tclient_conn()
    addon.client_connected(client)
    assert client.error == "egress: internal_error"
    addon.client_disconnected(client)  # bookkeeping: logged and counted only


def test_lifecycle_hooks_are_not_wrapped():
    addon = failsafe.fail_closed(Broken())
    with pytest.raises(RuntimeError):
        addon.configure(set())


def test_test_fault_only_when_set(monkeypatch):
    class Fine:
        def requestheaders(self, flow):
            pass

    monkeypatch.delenv(failsafe.TEST_FAULT_ENV, raising=False)
    flow = tflow.tflow()
    failsafe.fail_closed(Fine()).requestheaders(flow)
    assert flow.response is None
    monkeypatch.setenv(failsafe.TEST_FAULT_ENV, "Fine.requestheaders@other.test")
    addon = failsafe.fail_closed(Fine())
    addon.requestheaders(flow)
    assert flow.response is None  # another host
    flow.request.host = "other.test"
    addon.requestheaders(flow)
    assert flow.response.status_code == 403



class Deciding:
    """next_layer hooks: one that fails, one that asks mitmproxy to wait for more bytes."""

    async def next_layer(self, nextlayer):
        if nextlayer.context.server.address[0] == "wait.test":
            raise exceptions.AddonHalt
        raise RuntimeError("boom")


def _nextlayer(host: str) -> layer.NextLayer:
    ctx = context.Context(tclient_conn(), options.Options())
    ctx.server.address = (host, 443)
    return layer.NextLayer(ctx)


def test_next_layer_refuses_the_tunnel():
    addon = failsafe.fail_closed(Deciding())
    nextlayer = _nextlayer("a.example.test")
    before = errors("next_layer")
    asyncio.run(addon.next_layer(nextlayer))
    assert isinstance(nextlayer.layer, RefuseLayer)  # closes the client; nothing is stacked
    assert errors("next_layer") == before + 1


def test_addon_halt_is_not_an_error():
    addon = failsafe.fail_closed(Deciding())
    nextlayer = _nextlayer("wait.test")
    before = errors("next_layer")
    with pytest.raises(exceptions.AddonHalt):
        asyncio.run(addon.next_layer(nextlayer))
    assert nextlayer.layer is None and errors("next_layer") == before
