"""What kind of task a prompt is: code, extraction or chat (for `-P auto`).

Deterministic and explainable: a handful of textual signals each add points to "code"
or "extraction"; the side with more points wins when it has at least `THRESHOLD`,
otherwise the prompt is chat. `detect_task` returns the winner and the signals that
decided it, which `--explain` prints.

The profiles stand for how a reply relates to its prompt, which is what decides the
fastest decoding method:

- code: source code in the prompt (fences, code-shaped lines) or asked for (a
  programming language, "write a function"): replies copy identifiers and whole lines.
- extraction: summarise, extract, translate, rewrite, classify... a text that is in the
  prompt, or any long pasted context: replies copy spans of the prompt.
- chat: everything else (questions, advice, stories, reasoning): replies are new text.

Accuracy on labelled prompts is tested in tests/test_tasks.py (Spec-Bench categories and
the code sets mapped to profiles; the mapping is written down there and in the README).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CODE, CHAT, EXTRACTION = "code", "chat", "extraction"
THRESHOLD = 3  # points a side needs to beat chat
LONG_CONTEXT_CHARS = 1500  # a prompt this long is mostly pasted material
PASTED_CHARS = 700  # longer than questions and chat requests usually are

_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)")
_DEFINITION = re.compile(
    r"^\s*((async\s+)?def\s+\w+\s*\(.*|class\s+\w+.*:|(function|func|fn)\s+\w+\s*\(.*|#include\s*<.*)\s*$", re.MULTILINE
)
_CODE_LINE = re.compile(
    r"""^\s*(
        (async\s+)?def\s+\w+\s*\( | class\s+\w+[\s:(] | import\s+[\w.]+ | from\s+[\w.]+\s+import\s |
        \#include\s* <? | (function|func|fn)\s+\w+\s*\( | (const|let|var)\s+\w+\s*= |
        (public|private|protected|static)\s+[\w<>\[\]]+\s+\w+ | package\s+\w+ | return\b.* |
        (if|for|while|elif|else|try|except|with)\b.*:\s*$ | @\w+ | >>>\s |
        .*[;{}]\s*$ | .*\)\s*(->\s*[\w\[\], .]+)?\s*:\s*$
    )""",
    re.VERBOSE,
)
_LANGUAGE = re.compile(
    r"\b(python|javascript|typescript|java(?!nese)|c\+\+|c#|rust|golang|kotlin|swift|ruby|php|perl|haskell|scala|"
    r"sql|html|css|bash|powershell|matlab|fortran|django|numpy|pandas)\b|\bgo\s+(function|program|code)\b|"
    r"(?<!\w)c\s+(program|function|code)\b",
    re.IGNORECASE,
)
_CODE_NOUN = (
    r"(function|program|script|code|snippet|class|method|algorithm|regex|regular expression|unit tests?|api|query|"
    r"compiler|bug|website|web ?page|web app)"
)
_CODE_REQUEST = re.compile(
    rf"\b(write|implement|create|develop|build|code|fix|debug|refactor|complete|optimi[sz]e)\b[^.?!\n]{{0,60}}\b{_CODE_NOUN}",
    re.IGNORECASE,
)
_CODE_WORD = re.compile(rf"\b{_CODE_NOUN}\b", re.IGNORECASE)
_EXTRACTION_VERB = re.compile(
    r"\b(summar(y|ies|i[sz]e|i[sz]ing)|tl;?dr|extract|translat(e|ion)|rewrite|re-write|rephrase|paraphrase|proofread|"
    r"copy-?edit|correct the (grammar|spelling)|classify|categori[sz]e|identify the|analy[sz]e the following|"
    r"evaluate the following|convert the following|turn (this|the following)|list (every|all)|make a timeline)\b",
    re.IGNORECASE,
)
_TRANSLATION_HEADER = re.compile(r"^\s*\w+\s+to\s+\w+\s*:", re.IGNORECASE)
_TEXT_REFERENCE = re.compile(
    r"\b(the following|(the|this) (text|passage|article|paragraph|document|e-?mail|minutes|reviews?|story|transcript|"
    r"report|abstract|context|excerpt|recipe)s?( below| above)?|according to the|based on the (text|passage|article|"
    r"document|above|context|information)|given (text|passage|article)|read the (text|passage|article|document))\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class TaskGuess:
    """A detected task: the profile name and the signals that decided it."""

    profile: str
    reasons: tuple[str, ...]
    scores: tuple[tuple[str, int], ...] = ()

    def explain(self) -> str:
        """'code (``` fence; 4 code-shaped lines)'."""
        return f"{self.profile} ({'; '.join(self.reasons)})" if self.reasons else self.profile


def detect_task(prompt: str) -> TaskGuess:
    """Guess the task of `prompt`: CODE, EXTRACTION or CHAT, with reasons."""
    code: list[tuple[int, str]] = []
    extraction: list[tuple[int, str]] = []
    lines = [line for line in prompt.splitlines() if line.strip()]
    text = prompt.strip()
    head = text[:300]  # the instruction usually comes first...
    # ...or last (a question after a pasted document): words in the middle of a long
    # prompt belong to the material, not to the request.
    instruction = text if len(text) <= 600 else f"{head}\n{text[-300:]}"

    fence = _FENCE.search(prompt)
    if fence:
        tag = fence.group(1)
        code.append((4, f"a ```{tag} code fence") if tag else (2, "a ``` fence"))
    definition = _DEFINITION.search(prompt)
    if definition:
        code.append((3, f"a definition ({definition.group(0).strip()[:30]!r})"))
    code_lines = sum(1 for line in lines if _CODE_LINE.match(line))
    if code_lines >= 2 and code_lines >= 0.25 * len(lines):
        code.append((4, f"{code_lines} code-shaped lines"))
    request = _CODE_REQUEST.search(instruction)
    if request:
        code.append((3, f"asks for code ({request.group(0).strip()[:40]!r})"))
    language = _LANGUAGE.search(instruction)
    if language:
        code.append((3, f"names {language.group(0).strip()!r}"))
    elif not request and _CODE_WORD.search(head):
        code.append((1, f"mentions {_CODE_WORD.search(head).group(0)!r}"))

    verb = _EXTRACTION_VERB.search(head)
    if verb or _TRANSLATION_HEADER.match(prompt):
        word = verb.group(0) if verb else prompt.split(":", 1)[0].strip()
        extraction.append((3, f"asks to {word.lower()!r}"))
    reference = _TEXT_REFERENCE.search(prompt)
    if reference:
        extraction.append((2, f"refers to a given text ({reference.group(0).lower()!r})"))
    if len(prompt) >= LONG_CONTEXT_CHARS:
        extraction.append((3, f"long pasted context ({len(prompt)} characters)"))
    elif len(prompt) >= PASTED_CHARS:
        extraction.append((2, f"pasted material ({len(prompt)} characters)"))

    code_points = sum(p for p, _ in code)
    extraction_points = sum(p for p, _ in extraction)
    scores = ((CODE, code_points), (EXTRACTION, extraction_points))
    if max(code_points, extraction_points) < THRESHOLD:
        noted = [r for _, r in code + extraction]
        return TaskGuess(CHAT, ("no code or text-processing signal" if not noted else "weak signals only: " + ", ".join(noted),), scores)
    # Code wins ties: a request to rewrite code is code, the reply copies code.
    if code_points >= extraction_points:
        return TaskGuess(CODE, tuple(r for _, r in code), scores)
    return TaskGuess(EXTRACTION, tuple(r for _, r in extraction), scores)
