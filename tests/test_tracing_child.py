"""The exporter process's encoder: the official encoder's bytes, at a fraction of its CPU."""

from __future__ import annotations

import enum
import urllib.request
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult

from bot.tracing.child import Encoder, _session, export, poster, readable

RESOURCE = Resource.create({"service.name": "unit", "deployment.environment": "test"})

_ids = st.integers(min_value=1, max_value=(1 << 64) - 1)
_scalar = (
    st.text(max_size=12)
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
    | st.floats(allow_nan=False)
)
_value = _scalar | st.lists(st.text(max_size=6), max_size=3).map(tuple)
_attributes = st.dictionaries(st.text(min_size=1, max_size=10), _value, max_size=5)
_records = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=20),  # name
        st.integers(min_value=1, max_value=(1 << 128) - 1),  # trace id
        _ids,  # span id
        st.integers(min_value=0, max_value=(1 << 64) - 1),  # parent (0: a root)
        st.sampled_from([0, 1]),  # flags
        st.integers(min_value=0, max_value=4),  # kind
        st.integers(min_value=0, max_value=1 << 62),  # start
        st.integers(min_value=0, max_value=1 << 62),  # end
        _attributes,
        st.lists(
            st.tuples(st.integers(1, (1 << 128) - 1), _ids, st.sampled_from([0, 1])), max_size=2
        ).map(tuple),
        st.lists(
            st.tuples(st.text(max_size=8), st.integers(0, 1 << 62), _attributes), max_size=2
        ).map(tuple),
        st.booleans(),  # failed
    ),
    min_size=1,  # a frame holds one span at least
    max_size=6,
)


def _official(records: Sequence[Sequence[Any]]) -> bytes:
    encoded: bytes = encode_spans(
        [readable(r, RESOURCE) for r in records]
    ).SerializePartialToString()
    return encoded


@settings(max_examples=300, deadline=None)
@given(_records)
def test_the_encoding_is_the_official_encoders_byte_for_byte(
    records: list[tuple[Any, ...]],
) -> None:
    assert Encoder(RESOURCE).encode(records) == _official(records)
    # One encoder for every example, as the exporter keeps it: what it keeps encoded
    # (attribute pairs, names) never stands for another value (True for 1, say).
    assert _SHARED.encode(records) == _official(records)


_SHARED = Encoder(RESOURCE)


def test_kept_pairs_tell_equal_values_of_other_types_apart() -> None:
    encoder = Encoder(RESOURCE)
    for value in (1, True, 1.0, 0, False, 0.0, -0.0, "1", ("1",), (1,), (True,), ("a", "b")):
        record = ("s", 1, 2, 0, 1, 0, 1, 2, {"k": value}, (), (("e", 3, {"k": value}),), False)
        assert encoder.encode([record]) == _official([record]), value


def test_a_value_of_another_type_leaves_the_batch_to_the_official_encoder() -> None:
    class Outcome(enum.StrEnum):
        OK = "ok"

    odd = ("s", 1, 2, 0, 1, 0, 1, 2, {"outcome": Outcome.OK}, (), (), False)
    too_big = ("s", 1, 2, 0, 1, 0, 1, 2, {"n": 1 << 70}, (), (), False)
    late: tuple[Any, ...] = ("s", 1, 2, 0, 1, 0, 1, 1 << 64, {}, (), (), False)  # > fixed64
    for record in (odd, too_big, late):
        assert Encoder(RESOURCE).encode([record]) is None, record


class _Posted:
    """The transport object of the official exporter, as the child finds it."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def export(self, data: bytes) -> SimpleNamespace:
        self.bodies.append(data)
        return SimpleNamespace(success=True)  # what the exporter's export reads of it


class _Collecting(SpanExporter):
    """An exporter without that transport (an older release, or the console's)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append([s.name for s in spans])
        return SpanExportResult.SUCCESS


def _frame(count: int) -> list[Sequence[Any]]:
    return [[f"s{n}", 7, n + 1, 0, 1, 0, 1, 2, {"n": n}, (), (), False] for n in range(count)]


def test_the_official_exporters_transport_posts_the_encoded_batches() -> None:
    exporter = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    assert poster(exporter) is not None  # this release has one: the fast path runs
    posted = _Posted()
    exporter._client = posted  # type: ignore[assignment]
    frame = _frame(5)
    export([frame], exporter, RESOURCE, 2)
    assert posted.bodies == [_official(frame[0:2]), _official(frame[2:4]), _official(frame[4:])]


def test_without_that_transport_the_sdks_spans_go_to_the_exporters_export() -> None:
    collecting = _Collecting()
    assert poster(collecting) is None
    assert poster(ConsoleSpanExporter()) is None
    export([_frame(3)], collecting, RESOURCE, 2)
    assert collecting.batches == [["s0", "s1"], ["s2"]]


def test_a_batch_the_encoder_leaves_goes_through_the_official_encoder() -> None:
    exporter = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    posted = _Posted()
    exporter._client = posted  # type: ignore[assignment]
    frame = _frame(1)
    frame[0][8]["big"] = 1 << 70  # int64 cannot hold it: the official encoder logs and skips it
    export([frame], exporter, RESOURCE, 2)
    assert len(posted.bodies) == 1  # posted all the same, by the exporter's export


def test_the_session_reads_the_proxy_settings_once_and_keeps_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    reads: list[str] = []
    original = urllib.request.getproxies_environment

    def counted() -> dict[str, str]:
        reads.append("environment")
        return original()

    monkeypatch.setattr(urllib.request, "getproxies_environment", counted)
    session = _session()
    assert session is not None
    url = "https://collector.example/v1/traces"
    first = session.merge_environment_settings(url, {}, None, None, None)
    seen = len(reads)
    second = session.merge_environment_settings(url, {}, None, None, None)
    assert first["proxies"]["https"] == "http://proxy.internal:3128"  # the operator's proxy
    assert second == first and len(reads) == seen > 0  # not read again for that URL
    second["proxies"]["https"] = "changed by a caller"
    third = session.merge_environment_settings(url, {}, None, None, None)
    assert third["proxies"]["https"] == "http://proxy.internal:3128"  # kept apart from callers


def test_a_credential_provider_makes_its_own_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", "gcp")
    assert _session() is None  # the exporter loads the provider's, as it would without us
