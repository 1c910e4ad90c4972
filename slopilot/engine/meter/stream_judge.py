"""One streamed completion, judged as its client sees it, from the SSE bytes written.

The proxy hands over each piece of the upstream's answer after writing it to the client,
with the moment it was written. The events it completes are read: each choice's first
text is its first token (TTFT from the request's arrival at the meter), and each later
event that brings tokens is one gap, the time since the choice's last one, however many
it brings (``ClientGaps``, as ``vllm bench serve`` times them). vLLM
streams a chunk per step, one token each, but merges the steps its API server could not
write yet into one chunk: a chunk's tokens are what it says (its continuous usage, which
the meter asks vLLM for on every chat and completions stream: ``usage_stats``; its token
ids; its logprobs), else one (a server that says nothing: its gaps are then the chunks'),
and the stream's last usage says how many there were in all. A chunk whose continuous
usage counts no token yet brings none, whatever its text: vLLM's chat ``echo`` sends the
last message back so, before the first token. A choice that finished (its finish
reason) is judged; one cut short (the client left, the engine's answer broke off, or
the engine failed it: vLLM writes an exception inside a stream it answered 200 as one
``data: {"error": ...}`` event) only where it had missed already (``verdicts``), as
the engine's server judges it. A stream the meter could not read (not SSE, not JSON) is
not judged: it passes through all the same. The events are read as a client's SSE parser
reads them (``written``): one held whole up to ``MAX_EVENT_BYTES``, parsed when it ends
as its client parses it (``json_steps``: ``json.loads``' value, what of it the judge
``READS``, or its error); one past them
as it passes, by the keys vLLM writes, where it writes them, none of it kept
(``long_event``: a completions ``echo`` with ``logprobs`` of a long prompt writes one,
which left the stream unjudged, for any client to ask for). Either in steps of
``STEP_BYTES`` that let the proxy's loop run between them (``read_steps``).

A Responses API stream (``Wire.RESPONSES``) is one answer of named events with no
``[DONE]``: its output deltas are its one choice's chunks, its ``response.completed``
finishes it with the usage, a failure cuts it short (``responses_events``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Generator, Iterator
from typing import Any

from slopilot.engine.client_gaps import ClientGaps
from slopilot.engine.meter import json_steps, responses_events
from slopilot.engine.meter.client_latency import ClientLatency
from slopilot.engine.meter.json_steps import COUNT, WHOLE, Keep
from slopilot.engine.meter.long_event import OUTPUT_FIELDS, LongEvent, Wire
from slopilot.engine.slo import ClassSLO

__all__ = ["MAX_EVENT_BYTES", "STEP_BYTES", "StreamJudge", "Verdict", "Wire"]

MAX_EVENT_BYTES = 1 << 20
"""Bytes one SSE event may take before the meter reads it as it passes, by its keys,
rather than whole (``long_event``): the upstream is the tenant's image, and an event that
never ends would otherwise grow the buffer without bound."""
STEP_BYTES = 1 << 16
"""The most bytes of the events read in one step (``read_steps``): an upstream read's
(httpx's, from h11), parsed (a held event's, ``json_steps``) or handed to a long event's
reader. Read in one go, a long event's first MiB, held until the event is known to be
long, stalled every other stream's relay up to 20 ms; an event just under 1 MiB parsed
whole, 8-35 ms."""

READS: dict[Wire, Keep] = {
    Wire.CHOICES: Keep(keys={
        "model": WHOLE, "usage": Keep(keys={"completion_tokens": WHOLE}),
        "error": Keep(keys={}), "choices": Keep(items=Keep(keys={
            "index": WHOLE, "finish_reason": WHOLE, "text": WHOLE, "token_ids": COUNT,
            "delta": Keep(keys=dict.fromkeys(OUTPUT_FIELDS, WHOLE)),
            "logprobs": Keep(keys={"content": COUNT, "tokens": COUNT})}))}),
    Wire.RESPONSES: Keep(keys={
        "type": WHOLE, "delta": WHOLE, "logprobs": COUNT, "item": Keep(keys={"type": WHOLE}),
        "response": Keep(keys={
            "model": WHOLE, "status": WHOLE, "incomplete_details": Keep(keys={"reason": WHOLE}),
            "usage": Keep(keys={"output_tokens": WHOLE})})}),
}
"""All the judge reads of an event's JSON (``_chunk``, ``_output``, ``_tokens``,
``responses_events``), by wire: what is kept of a held event parsed in steps
(``json_steps``), the rest parsed to know it is JSON and dropped as it goes (a Responses
answer's ``output``, each log probability but its count). A field read and not kept here
is missing only from the events parsed in steps, so the judge's reads are recorded on
vLLM's streams and held against this table both ways (``tests/engine/meter/
test_judge_reads.py``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """One choice's: whether it met the class's SLO, and the output tokens it brought; or
    ``choices`` judged alike, the tokens theirs together (the choices of a stream cut
    short that never came: ``StreamJudge.verdicts``)."""

    met: bool
    tokens: int
    choices: int = 1


@dataclasses.dataclass(slots=True)
class _Choice:
    gaps: ClientGaps = dataclasses.field(default_factory=ClientGaps)
    ttft_s: float | None = None
    tokens: int = 0
    gap_count: int = 0
    over: int = 0
    finished: bool = False
    usage_tokens: int = 0
    """The choice's tokens so far by its chunks' continuous usage (0 without)."""


class StreamJudge:
    """The choices of one stream, read event by event as the bytes are written."""

    def __init__(self, slo: ClassSLO, arrival: float, *, choices: int = 1,
                 max_tokens: int | None = None, latency: ClientLatency | None = None,
                 wire: Wire = Wire.CHOICES) -> None:
        """``choices`` and ``max_tokens``: the choices the request streams (its ``n``,
        times its prompts for a list of them, once the engine took them: ``n``, the
        proxy's to raise) and its ``max_tokens`` (None: not given, the engine's limit),
        for a stream cut short (``verdicts``).
        ``latency``: where each first token and gap is observed as it is read.
        ``wire``: how the stream's events are laid out (the request's API)."""
        self.slo, self.arrival = slo, arrival
        self.latency, self.wire = latency, wire
        self.n, self.max_tokens = choices, max_tokens
        self.tbt_s = None if slo.tbt_p99_ms is None else slo.tbt_p99_ms / 1000.0
        self.model: str | None = None
        """The model the events name (the served model's name)."""
        self._partial = b""
        """The line not yet ended."""
        self._lines: list[bytes] = []
        """The event's lines so far, and their bytes."""
        self._event_bytes = 0
        self._long: LongEvent | None = None
        """The event under way where it is past ``MAX_EVENT_BYTES``."""
        self._after_cr = False
        """Whether the last piece ended on a CR: an LF starting the next ends no line."""
        self._budget = STEP_BYTES
        """The bytes that may still be parsed, or handed a long event's reader, in the step
        under way."""
        self._choices: dict[int, _Choice] = {}
        self._usage_tokens: int | None = None
        self._done = False
        self._failed = False
        """The engine failed the stream (its error event): what follows is not read."""
        self._unreadable = False

    def written(self, data: bytes, at: float) -> None:
        """``data`` reached the client at ``at``: read the events it completes.

        Lines as SSE ends them (CRLF, LF or a bare CR) and as a client's parser reads
        them: a CR ends its line at once, and an LF right after it, in this piece or the
        next, is part of that end, so an event whose CRLF a read split is seen when its
        CR came, not with the next event. An event is read whole (its lines held) up to
        ``MAX_EVENT_BYTES``, past them as it passes (``LongEvent``), however the reads
        split it: seen at the piece that ends it either way."""
        for _ in self.read_steps(data, at):
            pass

    def read_steps(self, data: bytes, at: float) -> Iterator[None]:
        """``written``, in steps: between two, the caller on the event loop lets it run
        (``proxy``). Each parses, or hands a long event's reader, ``STEP_BYTES`` at most
        of the events (a held event's parse: ``json_steps``); the judge is the caller's
        alone until the last, and read to its end (``verdicts`` read it whole)."""
        if self._unreadable or self._done or self._failed or not data:
            return
        self._budget = STEP_BYTES
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        self._after_cr = data.endswith(b"\r")
        *ended, rest = _LINE_END.split(data)
        for piece in ended:
            if self._long is not None:
                if (yield from self._to_long(self._long, piece, ended=True)):
                    self._long_event(at)
            elif line := self._partial + piece:
                self._partial = b""
                self._lines.append(line)
                self._event_bytes += len(line)
                yield from self._bound()
            else:
                lines_of_event, self._lines, self._event_bytes = self._lines, [], 0
                yield from self._event(lines_of_event, at)
            if self._unreadable or self._done or self._failed:
                return
        if self._long is not None:
            yield from self._to_long(self._long, rest, ended=False)
        else:
            self._partial += rest
            yield from self._bound()

    def _bound(self) -> Iterator[None]:
        """Past ``MAX_EVENT_BYTES`` the event under way is read as it passes: its lines
        so far handed over, none held."""
        if self._event_bytes + len(self._partial) <= MAX_EVENT_BYTES:
            return
        event = self._long = LongEvent(self.wire)
        lines, partial = self._lines, self._partial
        self._lines, self._partial, self._event_bytes = [], b"", 0
        for line in lines:
            yield from self._to_long(event, line, ended=True)  # a held line is no end
        yield from self._to_long(event, partial, ended=False)

    def _to_long(self, event: LongEvent, piece: bytes, *,
                 ended: bool) -> Generator[None, None, bool]:
        """``piece`` of the long ``event``'s line under way (``ended``: the line ends
        after it) handed to its reader in slices, a step ending wherever ``STEP_BYTES``
        were handed since the last; True where it was the event's end."""
        start = 0
        while True:
            if not self._budget and start < len(piece):
                yield
                self._budget = STEP_BYTES
            part = piece[start:start + self._budget]
            start += len(part)
            self._budget -= len(part)
            if start >= len(piece):
                return event.feed(part, ended=ended)
            event.feed(part, ended=False)

    def _long_event(self, at: float) -> None:
        """The event past ``MAX_EVENT_BYTES`` ended at ``at``: read as the chunk its keys
        make (``long_event``)."""
        event, self._long = self._long, None
        if event is None or not event.data_lines:
            return  # comments, a name: nothing to judge
        chunk = event.chunk()
        if chunk is None:
            self._unreadable = True
        elif self.wire is Wire.RESPONSES:
            name = event.name.decode("utf-8", "replace") if event.name is not None else None
            self._response_event(chunk, name, at)
        elif not self._chunk(chunk, at):
            self._unreadable = True

    def _event(self, lines: list[bytes], at: float) -> Iterator[None]:
        # An event's data is its data lines joined by newlines (SSE); comments, event
        # names and ids are allowed, and carry nothing to judge.
        parts = [line[5:].removeprefix(b" ") for line in lines
                 if line.startswith(b"data:") or line == b"data"]
        if not parts:
            return
        payload = b"\n".join(parts).strip()
        if payload == b"[DONE]":
            self._done = True
            return
        try:
            if len(payload) <= self._budget:  # a chunk of vLLM's, a few hundred bytes
                self._budget -= len(payload)
                chunk = json.loads(payload)
            else:
                chunk, left = yield from json_steps.loads(payload, STEP_BYTES, self._budget,
                                                          READS[self.wire])
                self._budget = max(0, left)
        except (ValueError, RecursionError):
            self._unreadable = True
            return
        if not isinstance(chunk, dict):
            self._unreadable = True
        elif self.wire is Wire.RESPONSES:
            self._response_event(chunk, _event_name(lines), at)
        elif not self._chunk(chunk, at):
            self._unreadable = True

    def _response_event(self, event: dict[str, Any], name: str | None, at: float) -> None:
        """Read one event of a Responses stream: its one choice, index 0. Its type as the
        OpenAI client dispatches on it, the JSON's own ``type``, else the SSE event's name;
        an event of a type the meter does not know carries nothing to judge."""
        kind = event.get("type")
        kind = kind if isinstance(kind, str) else name or ""
        if (model := responses_events.model(event)) is not None:
            self.model = model[:200]
        choice = self._choices.setdefault(0, _Choice())
        if tokens := responses_events.output_tokens(event, kind):
            self._observe(choice, tokens, at)
        end = responses_events.ending(event, kind)
        if end is responses_events.Ending.FINISHED:
            choice.finished, self._done = True, True
            self._usage_tokens = responses_events.usage_tokens(event)
        elif end is responses_events.Ending.FAILED:
            self._failed = True

    def _chunk(self, chunk: dict[str, Any], at: float) -> bool:
        """Read one chunk; False where it is not a completion chunk."""
        if isinstance(model := chunk.get("model"), str):
            self.model = model[:200]
        usage = chunk.get("usage")
        if isinstance(usage, dict) and type(usage.get("completion_tokens")) is int:
            self._usage_tokens = usage["completion_tokens"]
        choices = chunk.get("choices")
        if "error" in chunk:
            # The engine failed the request mid-stream (then writes [DONE] all the same):
            # its unfinished choices were cut short there, as by a broken connection.
            self._failed = True
            return True
        if not isinstance(choices, list):
            return choices is None
        for raw in choices:
            if not isinstance(raw, dict) or type(raw.get("index")) is not int:
                return False
            choice = self._choices.setdefault(raw["index"], _Choice())
            # vLLM's continuous usage counts the chunk's one choice's tokens so far.
            so_far = usage.get("completion_tokens") if isinstance(usage, dict) and \
                len(choices) == 1 else None
            carried = None
            if type(so_far) is int:
                carried, choice.usage_tokens = so_far - choice.usage_tokens, so_far
            # No token generated yet: the text is not the engine's (a chat ``echo`` of the
            # last message), and the first token is still to come.
            if _output(raw) and so_far != 0:
                self._observe(choice, _tokens(raw, carried, first=choice.ttft_s is None), at)
            if raw.get("finish_reason") is not None:
                choice.finished = True
        return True

    def _observe(self, choice: _Choice, tokens: int, at: float) -> None:
        """A chunk of ``tokens`` of ``choice``'s output reached the client at ``at``."""
        if choice.ttft_s is None:
            choice.ttft_s = at - self.arrival
            if self.latency is not None:
                self.latency.first_token(choice.ttft_s)
        choice.tokens += tokens
        gap = choice.gaps.written(tokens, at)
        if gap is None:
            return
        if self.latency is not None:
            self.latency.token_gap(gap)
        choice.gap_count += 1
        if self.tbt_s is not None and gap > self.tbt_s:
            choice.over += 1

    def verdicts(self, now: float) -> list[Verdict]:
        """Each choice's verdict, the stream having ended at ``now``, as the engine's
        server has them (``responses.ChoiceState.verdict``). A choice that finished is
        judged (none without a token: nothing to judge). One cut short (the client left,
        the engine's answer broke off or it failed the stream) only where it had missed
        already, whatever would
        have followed: no first token within the TTFT target (by ``now`` if none came),
        or more slow gaps than 1 % of all its ``max_tokens`` allow; else its end could
        still have met the SLO, and it is not judged. Unjudged, the clients an overloaded
        deployment drove away vanished from its goodput share. The choices of which
        nothing came are judged alike (no first token by ``now``): one verdict of their
        count, last, however many a batch's ``n`` times its prompts makes (a million,
        judged an object each, held the proxy's loop for 3 s). None for a stream the
        meter could not read."""
        if self._unreadable:
            return []
        choices = list(self._choices.values())
        unseen = max(0, self.n - len(choices))
        # The usage counts every choice's tokens together: exact for one, streamed whole.
        usage = self._usage_tokens if self._done and len(choices) + unseen == 1 else None
        # Without max_tokens the engine's limit is the context: no count of slow gaps
        # could have missed the SLO yet.
        most = sys.maxsize if self.max_tokens is None else max(0, self.max_tokens - 1)
        out = []
        for c in choices:
            if c.finished:
                if c.ttft_s is not None:
                    out.append(Verdict(self.slo.met(c.ttft_s, c.gap_count, c.over),
                                       c.tokens if usage is None else usage))
            elif not self.slo.met(now - self.arrival if c.ttft_s is None else c.ttft_s,
                                  most, c.over):
                out.append(Verdict(False, c.tokens))
        if unseen and not self.slo.met(now - self.arrival, most, 0):
            out.append(Verdict(False, 0, unseen))
        return out


    def first_tokens_missed(self) -> int:
        """The choices, the stream having ended, that got no first token and did not
        finish (cut short: the client left, the engine broke off or failed it), those of
        which nothing came included; 0 for a stream the meter could not read. In no TTFT
        observation, each is a first token never given (``ClientLatency.never_first``)."""
        if self._unreadable:
            return 0
        cut = sum(1 for c in self._choices.values() if c.ttft_s is None and not c.finished)
        return cut + max(0, self.n - len(self._choices))

    def left_within_ttft(self, now: float) -> bool:
        """Whether a choice of it given no first token by ``now`` ended within the TTFT
        target (``ClassSLO.left_within_ttft``), missing nothing, as ``verdicts`` judges
        it: they all waited since the request came."""
        return self.slo.left_within_ttft(now - self.arrival)


def _event_name(lines: list[bytes]) -> str | None:
    """The SSE event's name (its last ``event:`` line), None where it has none."""
    names = [line[6:].removeprefix(b" ") for line in lines if line.startswith(b"event:")]
    return names[-1].decode("utf-8", "replace") if names else None


def _output(choice: dict[str, Any]) -> bool:
    """Whether a choice's chunk carries generated output: completions' ``text``, or a
    chat delta's content, reasoning or tool calls (an agent's stream may carry nothing
    else); a delta with only a role, or empty fields, carries none."""
    if isinstance(text := choice.get("text"), str) and text:
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(
        delta.get(field) for field in OUTPUT_FIELDS)


def _tokens(choice: dict[str, Any], carried: int | None, *, first: bool) -> int:
    """How many tokens a choice's chunk with output brings: vLLM merges the outputs its
    API server had not written yet into one chunk, so a busy server's chunks bring
    several. Said by its continuous usage's growth (``carried``: generated tokens only),
    its ``token_ids`` (``return_token_ids``) or its logprobs (one entry a token; not on a
    completion's first chunk, where ``echo`` puts the prompt's before them, as it puts
    the prompt's ids before its ``token_ids``); one where none says."""
    if carried is not None and carried > 0:
        return carried
    if isinstance(ids := choice.get("token_ids"), list) and ids:
        return len(ids)
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        entries = logprobs.get("content")  # chat
        if entries is None and not first:
            entries = logprobs.get("tokens")  # completions
        if isinstance(entries, list) and entries:
            return len(entries)
    return 1


_LINE_END = re.compile(rb"\r\n|\r|\n")
