"""How per-process NCCL verdicts combine into one for a whole log, field by field."""

from __future__ import annotations

from fsdp_train.contract.nccl import NcclVerdict, _is_libfabric, combine


def test_one_process_keeps_its_identity_and_several_do_not() -> None:
    only = NcclVerdict("efa", process="h:1", rank=3, evidence_lines=("a",))
    assert combine([only]) == only
    many = combine([NcclVerdict("efa", process="h:1", rank=0), NcclVerdict("efa", process="h:2", rank=1)])
    assert (many.process, many.rank) == ("", None)


def test_the_worst_transport_decides_and_every_evidence_line_is_kept_in_order() -> None:
    verdicts = [
        NcclVerdict("efa", evidence="e1", evidence_lines=("e1",), process="h:1", rank=0),
        NcclVerdict("socket", evidence="s1", evidence_lines=("s0", "s1"), process="h:2", rank=1),
        NcclVerdict("init-failed", evidence="f", evidence_lines=("f",), process="h:3", rank=2),
    ]
    combined = combine(verdicts)
    assert (combined.transport, combined.evidence) == ("init-failed", "f")
    assert combined.evidence_lines == ("e1", "s0", "s1", "f")
    assert combine(verdicts[:2]).transport == "socket"
    assert combine([NcclVerdict("none"), NcclVerdict("none", evidence="x")]).evidence == ""
    assert combine([NcclVerdict("none"), NcclVerdict("unknown", evidence="u")]).transport == "unknown"
    assert combine([]) == NcclVerdict("unknown")


def test_versions_come_from_any_process_that_printed_them() -> None:
    combined = combine([NcclVerdict("socket"), NcclVerdict("efa", nccl_version="2.29.7", ofi_version="1.20.0")])
    assert (combined.transport, combined.nccl_version, combined.ofi_version) == ("socket", "2.29.7", "1.20.0")
    own = combine(
        [NcclVerdict("socket", nccl_version="2.28", ofi_version="1.1"), NcclVerdict("efa", nccl_version="2.29")]
    )
    assert (own.nccl_version, own.ofi_version) == ("2.28", "1.1")
    assert (combine([NcclVerdict("efa"), NcclVerdict("efa")]).nccl_version) == ""


def test_libfabric_plugin_names() -> None:
    for name in ("Libfabric", "AWS Libfabric", "libfabric", "OFI", "aws-ofi", "AWS-OFI"):
        assert _is_libfabric(name), name
    for name in ("Socket", "IB", "ofi2", ""):
        assert not _is_libfabric(name), name


def test_the_job_summary_of_rank_transports() -> None:
    from fsdp_operator.decide.transport import _summary

    assert _summary({}, complete=False) == "pending"
    # A fallback shows at once, before every rank reported; two different ones are "mixed".
    assert _summary({"socket": [1]}, complete=False) == "socket"
    assert _summary({"socket": [1], "efa": [0]}, complete=False) == "mixed"
    assert _summary({"socket": [1], "ib": [2]}, complete=True) == "mixed"
    assert _summary({"efa": [0]}, complete=False) == "pending"
    assert _summary({"efa": [0, 1]}, complete=True) == "efa"
    assert _summary({"none": [0, 1]}, complete=True) == "none"
    assert _summary({"none": [0], "efa": [1]}, complete=True) == "efa"
    assert _summary({"unknown": [0], "efa": [1]}, complete=True) == "unknown"


def test_clean_text_cuts_past_its_limit_only() -> None:
    from fsdp_train.contract.events import clean_text

    assert clean_text("a" * 10, 10) == "a" * 10
    cut = clean_text("a" * 11, 10)
    assert len(cut) == 10 and cut.endswith("…")
    # Escape sequences and control characters go before the length is judged.
    assert clean_text("\x1b[31m" + "b" * 10 + "\x00", 10) == "b" * 10
