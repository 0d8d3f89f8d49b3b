"""Provenance of argument values: where each value of a proposal was seen before it was proposed.

For every proposal the gate asks where each argument value came from: the user's request, the
application's trusted data (``RunContext.app_data``), the output of an earlier call (which call
id, which tool, and whether that tool declared its output trusted: :mod:`fencepost.policy.trust`),
or nowhere — the model's own. Rules and approvers judge the answer (:class:`Provenance`), and the
built-in rule refuses, or asks about, a write whose sensitive arguments trace only to untrusted
output (:func:`untrusted_arguments`).

How values are matched — by value, normalised, never by position:

- text is compared without invisible format characters (zero-width, soft hyphen, bidi and tag
  characters), after Unicode NFKC, lower-casing and whitespace collapse (``"  Bob\\tSmith"``
  is ``"bob smith"``), and is found inside a longer text only as a whole token run: ``"bob"``
  is not seen in ``"bobsled"``. Lower-casing, not full case folding: folding makes ``ß``
  ``ss`` (and a final sigma an ordinary one), and ``straße.de`` is another domain than
  ``strasse.de`` (IDNA2008), which a value an attacker wrote must not pass for;
- identifiers inside strings are traced on their own: URLs (whole, without scheme and
  ``www.``, and their host), dotted host names (``evil.com``), email addresses (case-insensitive, local part
  included), IBAN-like account ids (``GB29 NWBK 6016 1331 9268 19`` is ``gb29nwbk60161331926819``);
  a string that holds any of these is traced by them alone, one that holds none as a whole.
  An identifier counts as seen in a trusted source only where it stands whole there, not as a
  piece of a longer one: ``acme.com`` is not in ``acme.com.au``, ``my-acme.com`` or
  ``x.bob@acme.com`` (a look-alike is the attacker's); in an untrusted output any occurrence
  counts (``evil.com.`` ending a sentence is ``evil.com``);
- numbers are compared as decimals: ``100 == 100.0 == "100.00" == "1,000"``-style separators
  removed; a number is found in a source's text as a whole number (``100`` is not in ``1000``);
- an object key is a value when it holds an identifier or a traced number (a result keyed by
  sender address: ``{"evil@x.com": ...}``); other keys are the producer's field names.

Which values are not traced (their source is ``model``): strings shorter than
:data:`MIN_TEXT_CHARS` characters after normalisation, numbers with fewer than
:data:`MIN_NUMBER_DIGITS` significant digits (``1``, ``50``, ``0.5``), booleans and nulls. They
occur everywhere by chance, so "seen in untrusted output" would say nothing about them.

Several values in one argument (a list of recipients, a URL whose host came from elsewhere than
its path, a dict of fields): each value is traced on its own, and :meth:`Provenance.sources` is
their union. :meth:`Provenance.only_untrusted` is true when *any* value of the argument traces
only to untrusted tool output — one injected recipient in a list of known ones is enough.

A value seen in the user's request, the app data or a trusted tool's output counts as theirs,
even if an untrusted output holds it too: an attacker who repeats an identifier the user gave
does not make it untrusted (and cannot make an untrusted one trusted either).

What it cannot see: a value the model transforms — summarised, translated, re-encoded
(base64, URL-escaped), split across arguments or assembled from pieces — is not the value that
was read, and traces to ``model``; so does a value the model was told in an earlier turn of the
conversation that is not in the run's request. Provenance is evidence about copying, not about
intent: a value the user typed can still be the wrong one.

Cost: each observation's normalised text, identifiers, numbers and word set are indexed once
and kept with the observation object (a weak reference: it goes with the run's state), so a
proposal costs, per traced value and earlier output, a few set lookups — a substring search
only in the outputs that hold every word of the value — never a re-indexing of the run's text.
The app data is indexed once per run context. A final answer is read first: one that names no
identifier and is shorter than a span (:func:`answer_traceable`) repeats nothing, and the run's
outputs are not read for it; the trusted sources are read only for what some untrusted output
holds of the answer. (200 proposals over a run growing to 200 outputs
of 2 KB each: about half a second in all on a busy 2-core machine, most of it reading the
run's outputs afresh at each gate.)
"""

from __future__ import annotations

import contextlib
import copy
import functools
import re
import unicodedata
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Generic, Literal, NamedTuple, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, Strict

from fencepost.policy.contract import Frozen
from fencepost.policy.effect import Effect
from fencepost.policy.observation import Observation
from fencepost.policy.tool import ToolSpec
from fencepost.policy.value_source import APP, MODEL, USER, ValueSource

__all__ = [
    "ANSWER_SPAN_WORDS",
    "MIN_NUMBER_DIGITS",
    "MIN_TEXT_CHARS",
    "ObservedOutput",
    "Provenance",
    "SourceIndex",
    "ValueSource",
    "answer_repeats_untrusted",
    "answer_traceable",
    "index_of",
    "normalise",
    "observed_output",
    "observed_outputs",
    "output_of",
    "provenance_of",
]

MIN_TEXT_CHARS = 4
"""Strings shorter than this (after normalisation) are not traced: their source is ``model``."""
MIN_NUMBER_DIGITS = 3
"""Numbers with fewer significant digits than this (``7``, ``50``, ``0.5``) are not traced."""
ANSWER_SPAN_WORDS = 8
"""A final answer "repeats" untrusted text when it holds a run of this many consecutive words
(punctuation ignored, normalised) found in untrusted output and in no trusted source — or an
identifier (URL, host, email, account id) found only there."""


class Provenance(Frozen):
    """Where the values of one proposal's arguments were seen, per top-level argument name.

    Holds sources only, never the values: a record of it (:meth:`record`) is safe in receipts,
    manifests and spans.

    >>> p = Provenance(values={"recipient": ((ValueSource(kind="tool", call_id="c1",
    ...     tool="read_inbox", trusted=False),),)})
    >>> p.only_untrusted("recipient"), p.record()
    (True, {'recipient': ['tool:c1']})
    """

    values: Annotated[
        dict[
            str,
            Annotated[tuple[Annotated[tuple[ValueSource, ...], Strict(False)], ...], Strict(False)],
        ],
        Strict(False),
    ] = Field(default_factory=dict)
    """Per argument name, per value traced in it (each item of a list, each identifier in a
    string), the sources that value was seen in, in order (user, app, then earlier outputs in
    the order observed); a value seen nowhere has the one source ``model``. An argument that
    holds nothing traceable (a boolean, ``null``, an empty list) has no values."""

    def sources(self, argument: str) -> tuple[ValueSource, ...]:
        """Every source of any value of ``argument``, each once (``()`` for an unknown name)."""
        return tuple(dict.fromkeys(s for value in self.values.get(argument, ()) for s in value))

    def only_untrusted(self, argument: str) -> bool:
        """Whether some value of ``argument`` traces only to untrusted tool output: seen in an
        untrusted output, and not in the request, the app data or a trusted tool's output."""
        return any(_only_untrusted(value) for value in self.values.get(argument, ()))

    def untrusted_calls(self, argument: str) -> tuple[str, ...]:
        """The call ids of the untrusted outputs the untrusted-only values of ``argument`` were
        seen in (empty when :meth:`only_untrusted` is false)."""
        ids = (
            s.call_id
            for value in self.values.get(argument, ())
            if _only_untrusted(value)
            for s in value
            if s.call_id is not None
        )
        return tuple(dict.fromkeys(ids))

    def record(self) -> dict[str, list[str]]:
        """The provenance as recorded: per argument, its sources' labels (``"user"``,
        ``"tool:call_3"``) — never a value."""
        return {name: [s.label for s in self.sources(name)] for name in self.values}


def _only_untrusted(value: tuple[ValueSource, ...]) -> bool:
    return bool(value) and all(s.untrusted_output for s in value)


# -- normalisation and indexing -------------------------------------------------------------------


def normalise(text: str) -> str:
    """``text`` as values are compared: without invisible format characters, NFKC, lower-cased,
    whitespace collapsed and stripped."""
    return " ".join(unicodedata.normalize("NFKC", text.translate(_invisible())).lower().split())


# Format characters (zero-width space and joiners, soft hyphen, bidi controls, tag characters):
# nobody reads them, a model copies past them, and one inside an address in a tool's output
# would hide the address from the index while the model proposes it without. Made at first
# use: walking the code points costs a tenth of a second, no import should pay it.
@functools.cache
def _invisible() -> dict[int, None]:
    return {code: None for code in range(0x110000) if unicodedata.category(chr(code)) == "Cf"}


_URL = re.compile(r"https?://[^\s<>\"'`\\\]\[(){}|^]+")
# The lookbehind starts a match only where its local part starts: without it, a long run of
# word characters with no ``@`` is scanned again from each of its characters (quadratic).
_EMAIL = re.compile(r"(?<![\w.%+-])[\w.%+-]+@(?:[a-z0-9-]+\.)+[a-z]{2,}")
_HOST = re.compile(r"(?<![\w@.-])(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,24}(?![\w-])")
_ACCOUNT = re.compile(
    r"(?<![\w])[a-z]{2}\d{2}(?:[a-z0-9]{8,30}|(?: [a-z0-9]{4}){2,7}(?: [a-z0-9]{1,4})?)(?!\w)"
)
_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w)|(?<![\w.])\d+(?:\.\d+)?(?!\w)")
_WHOLE_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_TRAILING = ".,;:!?'\""


def _number(text: str) -> str | None:
    """The canonical text of a decimal number (``"100.00"`` -> ``"100"``), or ``None``."""
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    return format(value.normalize(), "f")


def _number_of(item: int | float) -> str | None:
    """The canonical text of a JSON number. An int goes through ``Decimal`` directly: one past
    Python's 4,300-digit limit has no ``repr`` (app data or a result may hold one)."""
    if isinstance(item, int):
        return format(Decimal(item).normalize(), "f")
    return _number(repr(item))


def _digits(canonical: str) -> int:
    return len(canonical.lstrip("-").replace(".", "").lstrip("0"))


def _account(found: str) -> str | None:
    compact = found.replace(" ", "")
    return compact if sum(c.isdigit() for c in compact) >= 6 else None


@dataclass(frozen=True, slots=True)
class SourceIndex:
    """One source's values, indexed for matching: its strings normalised and joined, and the
    numbers and account ids found in them (and, for numbers, in its JSON numbers)."""

    text: str
    """The source's strings, normalised, joined by newlines (no normalised string holds one)."""
    numbers: frozenset[str]
    """Canonical decimal texts of every number in the source."""
    accounts: frozenset[str]
    """Account ids (IBAN-like) in the source, without spaces."""
    words: frozenset[str]
    """Every word (``\\w+`` run) of :attr:`text`: a value whose words are not all here is not in
    the text, which a set lookup says without searching it."""


EMPTY = SourceIndex("", frozenset(), frozenset(), frozenset())


def index_of(value: object) -> SourceIndex:
    """Index a JSON value (a tool's output, the app data) or a text (the request).

    An object key is indexed only when it holds an identifier or a traced number: other keys
    are the producer's field names, but a result keyed by address carries the addresses."""
    texts: list[str] = []
    numbers: set[str] = set()
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item:
                texts.append(normalise(item))
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int | float):
            canonical = _number_of(item)
            if canonical is not None:
                numbers.add(canonical)
        elif isinstance(item, Mapping):
            texts.extend(k for k in map(_key_value, item) if k is not None)
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    text = "\n".join(texts)
    for found in _NUMBER.findall(text):
        canonical = _number(found)
        if canonical is not None:
            numbers.add(canonical)
    accounts = {a for a in map(_account, _ACCOUNT.findall(text)) if a is not None}
    return SourceIndex(
        text, frozenset(numbers), frozenset(accounts), frozenset(_WORD.findall(text))
    )


def _key_value(key: object) -> str | None:
    """An object key, normalised, when it is a value (an identifier or a traced number)."""
    if not isinstance(key, str):
        return None
    text = normalise(key)
    if identifiers(text):
        return text
    numbers = (_number(n) for n in _NUMBER.findall(text))
    return text if any(n is not None and _digits(n) >= MIN_NUMBER_DIGITS for n in numbers) else None


# What would carry an identifier on, either side of it: a host's labels, an email's local part.
_GOES_ON_LEFT = frozenset(".-_%+")
_GOES_ON_RIGHT = frozenset("-_@")


def _occurs(needle: str, text: str, *, whole: bool = False) -> bool:
    """Whether ``needle`` occurs in ``text`` as whole tokens: not inside a longer word.
    ``whole``: as a whole identifier, not inside a longer one (a host's further labels, an
    email's longer local part); a leading ``www.`` is no part of a host."""
    size = len(needle)
    start = text.find(needle)
    while start != -1:
        end = start + size
        left = start == 0 or not needle[0].isalnum() or not text[start - 1].isalnum()
        right = end == len(text) or not needle[-1].isalnum() or not text[end].isalnum()
        if left and right and (not whole or _stands_whole(text, start, end)):
            return True
        start = text.find(needle, start + 1)
    return False


def _stands_whole(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is not the piece of a longer identifier."""
    if text[start - 4 : start] == "www.":
        start -= 4
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] in _GOES_ON_LEFT):
        return False
    if end == len(text):
        return True
    after = text[end]
    if after in _GOES_ON_RIGHT or after.isalnum():
        return False
    return not (after == "." and end + 1 < len(text) and text[end + 1].isalnum())


_WORD = re.compile(r"\w+")
V = TypeVar("V")


class _Atom(NamedTuple):
    """One traced value: how it is matched (``text``, ``identifier``, ``number``, ``account``)
    and its key."""

    kind: Literal["text", "identifier", "number", "account", "short"]
    key: str


def identifiers(text: str) -> list[_Atom]:
    """The identifiers in a normalised text: URLs and their hosts, emails, hosts, account ids."""
    found: list[_Atom] = []
    for url in _URL.findall(text):
        url = url.rstrip(_TRAILING)
        # Without its scheme and ``www.``: the same address, however the text spelled it.
        bare = url.split("://", 1)[1].removeprefix("www.").rstrip("/")
        if bare:
            found.append(_Atom("identifier", bare))
        try:
            host = urlsplit(url).hostname
        except ValueError:
            host = None
        if host:
            found.append(_Atom("identifier", host.removeprefix("www.")))
    without_urls = _URL.sub(" ", text)
    emails = _EMAIL.findall(without_urls)
    found.extend(_Atom("identifier", e) for e in emails)
    rest = _EMAIL.sub(" ", without_urls)
    found.extend(_Atom("identifier", h.removeprefix("www.")) for h in _HOST.findall(rest))
    for account in _ACCOUNT.findall(rest):
        compact = _account(account)
        if compact is not None:
            found.append(_Atom("account", compact))
    return list(dict.fromkeys(found))


def _atoms(value: object) -> list[_Atom]:
    """The traced values of one argument value, in order."""
    out: list[_Atom] = []
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, int | float):
            canonical = _number_of(item)
            if canonical is not None:
                kind: Literal["number", "short"] = (
                    "number" if _digits(canonical) >= MIN_NUMBER_DIGITS else "short"
                )
                out.append(_Atom(kind, canonical))
        elif isinstance(item, str):
            text = normalise(item)
            if not text:
                continue
            if _WHOLE_NUMBER.fullmatch(text):
                canonical = _number(text.lstrip("+"))
                if canonical is not None:
                    kind = "number" if _digits(canonical) >= MIN_NUMBER_DIGITS else "short"
                    out.append(_Atom(kind, canonical))
                    continue
            found = identifiers(text)
            if found:
                out.extend(found)
            elif len(text) >= MIN_TEXT_CHARS:
                out.append(_Atom("text", text))
            else:
                out.append(_Atom("short", text))
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))
    return out


def _seen_in(atom: _Atom, index: SourceIndex, *, trusted: bool = True) -> bool:
    """Whether ``atom`` occurs in the source ``index``. In a ``trusted`` one an identifier must
    stand whole (:func:`_stands_whole`): seen there, it passes for the user's or the app's."""
    key = atom.key
    if atom.kind == "number":
        return key in index.numbers
    if atom.kind == "account":
        return key in index.accounts or key in index.words
    whole = trusted and atom.kind == "identifier"
    return frozenset(_WORD.findall(key)) <= index.words and _occurs(key, index.text, whole=whole)


# -- the run's sources ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObservedOutput:
    """An earlier call's output as a source: its call id, tool, declared trust and index."""

    call_id: str
    tool: str
    trusted: bool
    index: SourceIndex
    source: ValueSource
    """This output as a :class:`ValueSource`."""


# The index of an observation is kept with the observation object (weakly: it goes with the
# state that holds it); within an invoke the state is carried along, so each output is indexed
# once per run, not once per proposal. Keyed by identity, never by a name anyone chooses.
# By identity (a frozen record hashes by its fields: slow, and a result may be unhashable).


class _ByIdentity(Generic[V]):
    """Values kept per live object, by identity: an entry goes when its object does."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[weakref.ref[Any], V]] = {}

    def get(self, owner: object) -> V | None:
        held = self._held.get(id(owner))
        return held[1] if held is not None and held[0]() is owner else None

    def put(self, owner: object, index: V) -> None:
        key = id(owner)
        held = self._held

        def gone(_: weakref.ref[Any]) -> None:
            entry = held.get(key)
            if entry is not None and entry[0]() is None:
                del held[key]

        held[key] = (weakref.ref(owner, gone), index)


_OUTPUTS: _ByIdentity[ObservedOutput] = _ByIdentity()
_APP: _ByIdentity[tuple[object, SourceIndex]] = _ByIdentity()
"""Per context object, the app data its index was made of (a copy) and the index: a frozen
context holds a plain dict, which an app may change in place between runs."""


def observed_output(observation: Observation, *, trusted: bool) -> ObservedOutput | None:
    """An observation as a source (``None`` for a tool error: it carries no values). Its index
    is made once per observation object."""
    if observation.kind != "tool_result":
        return None
    return output_of(
        observation,
        call_id=observation.call_id,
        tool=observation.tool_name,
        trusted=trusted,
        result=observation.result,
    )


def output_of(
    owner: object, *, call_id: str, tool: str, trusted: bool, result: object
) -> ObservedOutput:
    """A tool's output held by ``owner`` (a message, say) as a source, indexed once per live
    ``owner`` object (one no weak reference can name is indexed each time)."""
    made = _OUTPUTS.get(owner)
    if made is not None and made.trusted is trusted:
        return made
    index = made.index if made is not None else index_of(result)
    made = ObservedOutput(
        call_id,
        tool,
        trusted,
        index,
        ValueSource(kind="tool", call_id=call_id, tool=tool, trusted=trusted),
    )
    with contextlib.suppress(TypeError):
        _OUTPUTS.put(owner, made)
    return made


def observed_outputs(
    observations: Iterable[Observation], trusted: Callable[[str], bool]
) -> list[ObservedOutput]:
    """The run's tool results as sources, in order; ``trusted(tool_name)`` says whether a tool
    declared its output trusted (a tool no longer registered: untrusted)."""
    out = []
    for observation in observations:
        output = observed_output(observation, trusted=trusted(observation.tool_name))
        if output is not None:
            out.append(output)
    return out


def app_index(owner: object, app_data: Mapping[str, Any]) -> SourceIndex:
    """The index of ``app_data``, made once per ``owner`` (the run's context object) and
    again whenever the data differs from what it was made of."""
    if not app_data:
        return EMPTY
    held = _APP.get(owner)
    # Comparing with the copy costs far less than indexing again, and an index of data the
    # app has since changed would trace a revoked value to it.
    if held is not None and held[0] == app_data:
        return held[1]
    index = index_of(app_data)
    # An owner no weak reference can name is indexed each time.
    with contextlib.suppress(TypeError):
        _APP.put(owner, (copy.deepcopy(dict(app_data)), index))
    return index


def provenance_of(
    arguments: Mapping[str, Any],
    *,
    request: str | SourceIndex,
    app_data: Mapping[str, Any] | SourceIndex | None,
    outputs: Sequence[ObservedOutput],
    only: Iterable[str] | None = None,
) -> Provenance:
    """Where each value of ``arguments`` (a proposal's, by top-level name) was seen: in the
    ``request`` (the user's), the ``app_data`` (trusted) or the ``outputs`` of earlier calls
    (:func:`observed_output`), else nowhere (``model``). ``only``: trace these arguments alone
    (the sensitive ones, say); ``None``: every one. See the module docstring for how values
    are matched and what escapes it."""
    asked = index_of(request) if isinstance(request, str) else request
    app = app_data if isinstance(app_data, SourceIndex) else index_of(app_data or {})
    fixed = ((USER, asked), (APP, app))
    names = arguments.keys() if only is None else [n for n in only if n in arguments]
    values: dict[str, tuple[tuple[ValueSource, ...], ...]] = {}
    for name in names:
        traced: list[tuple[ValueSource, ...]] = []
        for atom in _atoms(arguments[name]):
            if atom.kind == "short":
                traced.append((MODEL,))
                continue
            seen = [s for s, index in fixed if _seen_in(atom, index)]
            seen.extend(o.source for o in _outputs_holding(atom, outputs))
            traced.append(tuple(seen) if seen else (MODEL,))
        values[name] = tuple(traced)
    return Provenance(values=values)


def _outputs_holding(atom: _Atom, outputs: Sequence[ObservedOutput]) -> list[ObservedOutput]:
    """The outputs ``atom`` occurs in. Run against every earlier output at every proposal: a
    set lookup passes over the many that lack it, a search is made only in the few that may
    hold it."""
    key = atom.key
    if atom.kind == "number":
        return [o for o in outputs if key in o.index.numbers]
    if atom.kind == "account":
        return [o for o in outputs if key in o.index.accounts or key in o.index.words]
    need = frozenset(_WORD.findall(key))
    whole = atom.kind == "identifier"
    return [
        o
        for o in outputs
        if need <= o.index.words and _occurs(key, o.index.text, whole=whole and o.trusted)
    ]


# -- the final answer -------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def _spans(words: list[str]) -> set[str]:
    n = ANSWER_SPAN_WORDS
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def _spans_held(spans: Mapping[str, frozenset[str]], index: SourceIndex) -> set[str]:
    """The spans (each with its set of words) that ``index``'s text holds. A span whose words
    are not all in the source is not in it, which a set lookup says; the text is read only
    for the rest, and a run of words joined only where one of them starts."""
    maybe = {span for span, words in spans.items() if words <= index.words}
    if not maybe:
        return maybe
    n = ANSWER_SPAN_WORDS
    firsts = {span.split(" ", 1)[0] for span in maybe}
    words = _words(index.text)
    held: set[str] = set()
    for i in range(len(words) - n + 1):
        if words[i] in firsts:
            span = " ".join(words[i : i + n])
            if span in maybe:
                held.add(span)
    return held


def answer_traceable(answer: str) -> bool:
    """Whether a final answer holds anything that could repeat a source: an identifier, or a
    run of :data:`ANSWER_SPAN_WORDS` words. One that holds neither repeats nothing, which its
    own text says without reading a single output of the run."""
    text = normalise(answer)
    return len(_words(text)) >= ANSWER_SPAN_WORDS or bool(identifiers(text))


def answer_repeats_untrusted(
    answer: str,
    *,
    request: str | SourceIndex,
    app_data: Mapping[str, Any] | SourceIndex | None,
    outputs: Sequence[ObservedOutput],
) -> tuple[str, ...]:
    """The call ids of the untrusted outputs a final answer repeats text of, in the order
    observed (empty: it repeats none). Repeats: a run of :data:`ANSWER_SPAN_WORDS` consecutive
    words of the answer (normalised, punctuation ignored), or an identifier of it (URL, host,
    email, account id), that occurs in an untrusted output and in none of the request, the app
    data and the trusted outputs."""
    text = normalise(answer)
    untrusted = [o for o in outputs if not o.trusted]
    if not text or not untrusted:
        return ()
    # What each untrusted output holds of the answer first: the trusted sources are read only
    # for what some untrusted output holds, and not at all in the usual case, where none does.
    spans = {span: frozenset(span.split(" ")) for span in _spans(_words(text))}
    held: dict[str, tuple[list[_Atom], set[str]]] = {}
    for atom in identifiers(text):
        for o in untrusted:
            if _seen_in(atom, o.index, trusted=False):
                held.setdefault(o.call_id, ([], set()))[0].append(atom)
    if spans:
        for o in untrusted:
            common = _spans_held(spans, o.index)
            if common:
                held.setdefault(o.call_id, ([], set()))[1].update(common)
    if not held:
        return ()
    asked = index_of(request) if isinstance(request, str) else request
    app = app_data if isinstance(app_data, SourceIndex) else index_of(app_data or {})
    trusted = [asked, app, *(o.index for o in outputs if o.trusted)]
    atoms = {a for found, _ in held.values() for a in found}
    theirs = {a for a in atoms if any(_seen_in(a, index) for index in trusted)}
    untrusted_spans: set[str] = set().union(*(found for _, found in held.values()))
    for index in trusted:
        if not untrusted_spans:
            break
        untrusted_spans -= _spans_held({s: spans[s] for s in untrusted_spans}, index)
    found = {
        call_id
        for call_id, (ids, copied) in held.items()
        if any(a not in theirs for a in ids) or copied & untrusted_spans
    }
    return tuple(c for c in dict.fromkeys(o.call_id for o in untrusted) if c in found)


# -- the built-in rule ------------------------------------------------------------------------------

ProvenanceMode = Literal["observe", "ask", "refuse"]
"""What the graph does with a write or external call whose sensitive arguments trace only to
untrusted output: record it and let it go on as any call (``"observe"``, the default), send it
to approval — the graph's approver first, if any, then a human (``"ask"``) — or refuse it with
the verdict ``untrusted_provenance`` (``"refuse"``: a policy denial, data under
``denial="observe"``). Every traced call's provenance is recorded whatever the mode."""

PROVENANCE_MODES: tuple[ProvenanceMode, ...] = ("observe", "ask", "refuse")

UNTRUSTED_PROVENANCE = "untrusted_provenance"
"""The safe code of a call the provenance rule refused."""


@dataclass(frozen=True, slots=True)
class RunSources:
    """A run's sources at one gate: the request, the app data, the earlier outputs, indexed."""

    request: SourceIndex
    app: SourceIndex
    outputs: tuple[ObservedOutput, ...]

    def trace(self, arguments: Mapping[str, Any], only: Iterable[str] | None = None) -> Provenance:
        """:func:`provenance_of` over these sources."""
        return provenance_of(
            arguments, request=self.request, app_data=self.app, outputs=self.outputs, only=only
        )

    def answer_repeats(self, answer: str) -> tuple[str, ...]:
        """:func:`answer_repeats_untrusted` over these sources."""
        return answer_repeats_untrusted(
            answer, request=self.request, app_data=self.app, outputs=self.outputs
        )


def run_sources(
    request: str,
    app_data: Mapping[str, Any] | None,
    outputs: Iterable[ObservedOutput],
    *,
    app_owner: object = None,
) -> RunSources:
    """The sources a run's proposals are traced against. ``app_owner``: the object the app data
    belongs to (the run's context), so it is indexed once per run, not per gate."""
    app = app_index(app_owner, app_data) if app_owner is not None and app_data else None
    return RunSources(
        request=index_of(request),
        app=app if app is not None else index_of(app_data or {}),
        outputs=tuple(outputs),
    )


def traced(spec: ToolSpec) -> bool:
    """Whether calls of ``spec`` are traced (and their provenance recorded): every write or
    external call, and any call of a tool that declares sensitive arguments. A plain read is
    not: tracing it would cost a search per value and decide nothing."""
    return spec.effect is not Effect.READ or bool(spec.sensitive)


def untrusted_sensitive(spec: ToolSpec, provenance: Provenance) -> tuple[str, ...]:
    """The built-in rule: the sensitive arguments of a write or external call that trace only
    to untrusted output (:meth:`Provenance.only_untrusted`). Empty: the rule has nothing
    against the call (a read, no sensitive arguments, or every one traced elsewhere too)."""
    if spec.effect is Effect.READ:
        return ()
    return tuple(name for name in spec.sensitive if provenance.only_untrusted(name))
