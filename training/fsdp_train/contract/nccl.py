"""Which network transport NCCL really used, read from its ``NCCL_DEBUG=INFO`` log (ranks and fsdpctl).

Pure Python, standard library only: a training rank classifies its own NCCL debug file after the
first collective, and ``fsdpctl diagnose nccl`` classifies logs a user already has.

What "in use" means
-------------------
NCCL picks one NET plugin per communicator at init and prints ``Using network <name>`` even when
every peer of the rank is on the same host; a 2-GPU NVLink run prints ``Using network Socket`` and
never opens a socket. So the selected plugin is only what NCCL *would* use across nodes. The
transport in use is decided from the strongest evidence present, in this order:

1. Channel connections (``Channel 00/0 : 1[1] -> 0[0] via NET/Socket/0``): a ``via NET/<plugin>``
   line means the network really carries traffic. ``Libfabric`` (older plugins: ``AWS Libfabric``)
   is ``efa`` unless aws-ofi-nccl named a non-EFA provider (``tcp``, ``sockets``: then ``socket``);
   ``IB``/``IBext`` is ``ib``; ``Socket`` is ``socket``; other names are ``unknown``. When several
   kinds appear (several communicators), the worst wins: socket, ib, unknown, then efa.
2. An init failure (``Failed to initialize any NET plugin``, ``Error: network X not found``):
   ``init-failed``.
3. Only intra-node channels (``via P2P/...``, ``via SHM/...``): ``none``.
4. No channel lines (log cut short, or ``NCCL_DEBUG_SUBSYS`` without them): ``none`` when NCCL
   reported ``nNodes 1``; otherwise the selected network (``Using network X``, ``Assigned NET plugin
   X to comm``, ``NET/OFI Selected provider is P``, or ``NET/Socket : Using``), because NCCL routes every
   inter-node connection through it.
5. aws-ofi-nccl failing (``No eligible providers``, ``aws-ofi-nccl initialization failed``) with no
   later choice: ``unknown``; NCCL's next step (IB, Socket, or failing) is not in the log.
6. Nothing: ``unknown``.

Only NCCL's own lines count (they carry ``NCCL INFO`` or ``NCCL WARN``); timestamps, Ray's
``(RayTrainWorker pid=..)`` prefix, colour codes and CRLF around them do not matter, and neither do
the project's ``FSDP_EVENT`` lines that quote NCCL lines as evidence.

A log holding several processes (``host:pid:tid [dev]`` prefixes, interleaved) is split per
process first; Ray's ``pid=, ip=`` stands in for a missing NCCL prefix, and lines with neither form
one group. ``[dev]`` is the CUDA device, not the rank: the rank comes from NCCL's ``rank R nranks N``
init line (of the largest communicator). The verdict for a whole log combines the per-process ones:
the worst of init-failed, socket, ib decides it; else efa if any process used EFA (processes with
only intra-node peers do not contradict that); else none when every process was intra-node only;
else unknown.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from .events import PREFIX as EVENT_PREFIX
from .events import TransportName

__all__ = ["NO_PREFIX", "NcclVerdict", "classify_by_rank", "classify_text", "combine"]

NO_PREFIX = "(no prefix)"
"""Key of :func:`classify_by_rank` for NCCL lines that carry no process prefix."""


@dataclass(frozen=True, slots=True)
class NcclVerdict:
    """The network transport one NCCL log (or one process in it) shows, with the lines that say so."""

    transport: TransportName
    plugin: str = ""
    """The NET plugin NCCL selected (``Libfabric``, ``AWS Libfabric``, ``Socket``, ``IB``), used or not."""
    provider: str = ""
    """The libfabric provider aws-ofi-nccl selected (``efa``, ``tcp``); empty when another plugin is used."""
    nccl_version: str = ""
    ofi_version: str = ""
    """aws-ofi-nccl version, when the plugin was loaded."""
    evidence: str = ""
    """The line that decided the verdict, stripped; empty when nothing in the log decides."""
    evidence_lines: tuple[str, ...] = ()
    """Every signal line, stripped, in log order; of the channel lines only the first per path."""
    process: str = ""
    """``host:pid`` of the process (per-process verdicts only)."""
    rank: int | None = None
    """The global rank NCCL printed for the process (per-process verdicts only)."""


# Every pattern below runs in time linear in the line: no nested or adjacent unbounded quantifiers that could
# backtrack into each other, unbounded runs possessive (`++`, Python 3.11+), free text between two fixed
# phrases bounded. Lines are also cut to MAX_LINE_CHARS before any pattern sees them.
MAX_LINE_CHARS = 4096
"""NCCL's own lines are a few hundred characters; anything longer is cut before it is matched."""
MAX_SIGNAL_LINES = 64
"""Evidence lines kept per process (the first ones: NCCL prints its decisions at init)."""
MAX_PROCESSES = 4096
"""Processes told apart in one log; lines of further processes go under :data:`NO_PREFIX`."""

# host:pid:tid [cudaDev] -- NCCL's prefix; WARN lines put a timestamp and file:line around it. The look-behind
# starts a match only where a host name can begin, so a long run of name characters is scanned once.
_NCCL_PREFIX = re.compile(r"(?<![\w.-])(?P<host>[\w.-]++):(?P<pid>\d++):(?P<tid>\d++) \[(?P<dev>\d++)\]")
# Ray's prefix on worker output: "(RayTrainWorker pid=123, ip=10.0.0.1) ".
_RAY_PREFIX = re.compile(r"\((?:[^()]*?\s)?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[\d.:a-fA-F]+))?\)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Every line NCCL (and aws-ofi-nccl through it) prints carries its level; other output is ignored.
_NCCL_LINE = re.compile(r"\bNCCL (?:INFO|WARN|TRACE)\b")

_VERSION = re.compile(r"\bNCCL version (\S+)")
_OFI_VERSION = re.compile(r"NET/OFI Initializing aws-ofi-nccl (\S+)", re.IGNORECASE)
_PROVIDER = re.compile(r"NET/OFI Selected provider is ([^\s,]+)", re.IGNORECASE)
_USING_NETWORK = re.compile(r"\bUsing (?:internal )?network (\S.*)", re.IGNORECASE)  # stripped by the caller
_ASSIGNED = re.compile(r"\bAssigned NET plugin (.{1,64}?) to comm\b")
_SOCKET_INIT = re.compile(r"\bNET/Socket : Using\b")
_CHANNEL_NET = re.compile(r"\bvia NET/([^/()]++)(?=[/(]|$)")  # stripped by the caller
_CHANNEL_LOCAL = re.compile(r"\bvia (P2P|SHM)\b")
_NNODES = re.compile(r"\bnNodes (\d{1,9})\b")
_RANK = re.compile(r"\brank (\d{1,9}) nranks (\d{1,9})\b", re.IGNORECASE)
# The first is NCCL >= 2.19; the second what older releases print when NCCL_NET names a missing plugin.
_INIT_FAILED = re.compile(r"Failed to initialize any NET plugin|Error: network .{1,64}? not found", re.IGNORECASE)
_OFI_FAILED = re.compile(r"No eligible providers|aws-ofi-nccl initialization failed", re.IGNORECASE)
# Not decisive, but tells a reader why EFA is absent: `NET/Plugin: ... Could not find ...` or `... failed`
# (matched as a prefix and two substring tests: `.*` between them would rescan the line per occurrence).
_PLUGIN_LINE = re.compile(r"NET/Plugin ?: ", re.IGNORECASE)


def _plugin_missing(line: str) -> bool:
    m = _PLUGIN_LINE.search(line)
    if m is None:
        return False
    rest = line[m.end() :].lower()
    return "could not find" in rest or "failed" in rest


_BAD: tuple[TransportName, ...] = ("init-failed", "socket", "ib")
"""Transports that prove a process did not use EFA, worst first."""


def _is_libfabric(plugin: str) -> bool:
    return "libfabric" in plugin.lower() or plugin.lower() in {"ofi", "aws-ofi"}


def _plugin_transport(plugin: str, provider: str) -> TransportName:
    """The transport a NET plugin name stands for, given aws-ofi-nccl's provider when known."""
    if _is_libfabric(plugin):
        kind = provider.lower()
        if not kind or kind.startswith("efa"):
            return "efa"
        if any(p in kind for p in ("tcp", "sockets", "udp")):
            return "socket"
        return "unknown"
    name = plugin.lower()
    if name.startswith("ib"):
        return "ib"
    if name == "socket":
        return "socket"
    return "unknown"


@dataclass(slots=True)
class _Process:
    """What one process's lines say, gathered in one pass."""

    nccl_version: str = ""
    ofi_version: str = ""
    provider: str = ""
    provider_line: str = ""
    using: str = ""
    using_line: str = ""
    assigned: str = ""
    assigned_line: str = ""
    socket_init_line: str = ""
    net_channels: list[tuple[str, str]] = field(default_factory=list)
    local_channel_line: str = ""
    single_node_line: str = ""
    multi_node: bool = False
    init_failed_line: str = ""
    ofi_failed_line: str = ""
    rank: int | None = None
    rank_nranks: int = 0
    signal_lines: list[str] = field(default_factory=list)
    channel_paths: set[str] = field(default_factory=set)

    def feed(self, line: str) -> None:
        signal = False
        if m := _VERSION.search(line):
            self.nccl_version = self.nccl_version or m.group(1)
            signal = True
        if m := _OFI_VERSION.search(line):
            self.ofi_version = self.ofi_version or m.group(1)
            signal = True
        if m := _PROVIDER.search(line):
            self.provider, self.provider_line, signal = m.group(1), line, True
        if m := _USING_NETWORK.search(line):
            self.using, self.using_line, signal = m.group(1).rstrip(), line, True
        if m := _ASSIGNED.search(line):
            self.assigned, self.assigned_line, signal = m.group(1), line, True
        if _SOCKET_INIT.search(line):
            self.socket_init_line, signal = self.socket_init_line or line, True
        if (m := _CHANNEL_NET.search(line)) and (plugin := m.group(1).rstrip()):
            if len(self.net_channels) < MAX_SIGNAL_LINES:
                self.net_channels.append((plugin, line))
            signal = self._new_path("NET/" + plugin)
        elif m := _CHANNEL_LOCAL.search(line):
            self.local_channel_line = self.local_channel_line or line
            signal = self._new_path(m.group(1))
        if m := _NNODES.search(line):
            if m.group(1) == "1":
                # The first one may decide the verdict (rule 4), so it is a signal line.
                signal = signal or not self.single_node_line
                self.single_node_line = self.single_node_line or line
            else:
                self.multi_node = True
        if m := _RANK.search(line):
            rank, nranks = int(m.group(1)), int(m.group(2))
            # The world communicator is the largest one the process joined.
            if nranks > self.rank_nranks:
                self.rank, self.rank_nranks = rank, nranks
        if _INIT_FAILED.search(line):
            self.init_failed_line, signal = self.init_failed_line or line, True
        if _OFI_FAILED.search(line):
            self.ofi_failed_line, signal = self.ofi_failed_line or line, True
        if _plugin_missing(line):
            signal = True
        if signal and len(self.signal_lines) < MAX_SIGNAL_LINES:
            self.signal_lines.append(line)

    def _new_path(self, path: str) -> bool:
        new = path not in self.channel_paths
        if new and len(self.channel_paths) < MAX_SIGNAL_LINES:
            self.channel_paths.add(path)
        return new

    def verdict(self, process: str) -> NcclVerdict:
        transport, evidence, plugin = self._decide()
        return NcclVerdict(
            transport=transport,
            plugin=plugin,
            # A provider only means something while the Libfabric plugin carries the traffic.
            provider=self.provider if not plugin or _is_libfabric(plugin) else "",
            nccl_version=self.nccl_version,
            ofi_version=self.ofi_version,
            evidence=evidence,
            evidence_lines=tuple(self.signal_lines),
            process=process,
            rank=self.rank,
        )

    def _decide(self) -> tuple[TransportName, str, str]:
        """(transport, deciding line, plugin), in the order the module docstring gives."""
        selected = self.using or self.assigned
        if self.net_channels:
            first: dict[TransportName, tuple[str, str]] = {}
            for plugin, line in self.net_channels:
                first.setdefault(_plugin_transport(plugin, self.provider), (plugin, line))
            for transport in ("socket", "ib", "unknown", "efa"):
                if transport in first:
                    plugin, line = first[transport]
                    # With Libfabric, the provider line is what names EFA (or its absence).
                    telling = self.provider_line if _is_libfabric(plugin) else ""
                    return transport, telling or line, plugin
        if self.init_failed_line:
            return "init-failed", self.init_failed_line, selected
        if self.local_channel_line:
            return "none", self.local_channel_line, selected
        if self.single_node_line and not self.multi_node:
            return "none", self.single_node_line, selected
        if selected:
            telling = self.provider_line if _is_libfabric(selected) else ""
            return (
                _plugin_transport(selected, self.provider),
                telling or self.using_line or self.assigned_line,
                selected,
            )
        if self.provider_line and not self.ofi_failed_line:
            return _plugin_transport("Libfabric", self.provider), self.provider_line, "Libfabric"
        if self.socket_init_line:
            return "socket", self.socket_init_line, "Socket"
        if self.ofi_failed_line:
            return "unknown", self.ofi_failed_line, ""
        return "unknown", "", ""


def _process_key(line: str) -> str:
    """``host:pid`` of the line's process; Ray's ``pid=, ip=`` prefix stands in when NCCL's is missing."""
    if m := _NCCL_PREFIX.search(line):
        return f"{m.group('host')}:{m.group('pid')}"
    if m := _RAY_PREFIX.search(line):
        return f"{m.group('ip') or 'pid'}:{m.group('pid')}"
    return NO_PREFIX


def _processes(text: str) -> dict[str, _Process]:
    processes: dict[str, _Process] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw[:MAX_LINE_CHARS]).strip()
        # Our own events quote NCCL lines as evidence; they are not NCCL output.
        if EVENT_PREFIX in line or not _NCCL_LINE.search(line):
            continue
        key = _process_key(line)
        if key not in processes and len(processes) >= MAX_PROCESSES:
            key = NO_PREFIX
        processes.setdefault(key, _Process()).feed(line)
    return processes


def classify_by_rank(text: str) -> dict[str, NcclVerdict]:
    """One verdict per process of an (interleaved) NCCL log, in order of first appearance.

    The key is the rank NCCL printed for the process (``"0"``), or ``host:pid`` when it printed
    none or two processes claim the same rank; lines without any prefix go under :data:`NO_PREFIX`.
    """
    verdicts = {key: process.verdict("" if key == NO_PREFIX else key) for key, process in _processes(text).items()}
    claims = Counter(v.rank for v in verdicts.values() if v.rank is not None)  # linear: thousands of processes
    return {str(v.rank) if v.rank is not None and claims[v.rank] == 1 else key: v for key, v in verdicts.items()}


def combine(verdicts: Iterable[NcclVerdict]) -> NcclVerdict:
    """The verdict for a whole log from its per-process verdicts (rules in the module docstring)."""
    items = list(verdicts)
    if not items:
        return NcclVerdict(transport="unknown")
    decided = _pick(items)
    return replace(
        decided,
        nccl_version=decided.nccl_version or next((v.nccl_version for v in items if v.nccl_version), ""),
        ofi_version=decided.ofi_version or next((v.ofi_version for v in items if v.ofi_version), ""),
        evidence_lines=tuple(line for v in items for line in v.evidence_lines),
        process=decided.process if len(items) == 1 else "",
        rank=decided.rank if len(items) == 1 else None,
    )


def _pick(items: list[NcclVerdict]) -> NcclVerdict:
    for transport in (*_BAD, "efa"):
        for verdict in items:
            if verdict.transport == transport:
                return verdict
    if all(v.transport == "none" for v in items):
        return items[0]
    return next(v for v in items if v.transport == "unknown")


def classify_text(text: str) -> NcclVerdict:
    """The network transport a whole NCCL log shows (one process, or several combined)."""
    return combine(classify_by_rank(text).values())
