"""The one decoding loop. Every method, the CLI, the TUI, tune and bench go through it.

    prefill(prompt) -> first token                      (step 0)
    repeat:
        draft   = proposer.propose(context)             k guessed tokens: a chain or a tree
                  (less its last node when that alone would start a new tile of rows)
        logits  = target([last, *draft], tree mask)     ONE forward, k+1 rows
        verdict = verify(draft, logits)                 kept path + target's next token
        cache  -> keep the root and the kept path       rollback / tree compaction
        proposer.update(...)                            adapt
        yield StepEvent                                 stream

A chain is the one-branch tree: it runs without a custom mask (the model's own causal
mask is the tree mask of a chain) and its kept path is a prefix, so compaction is a
crop. Everything else is the same code for chains and trees.

What a proposer needs beyond the verdict it says once in `proposer.needs()`: the
target's top next tokens per verified position (Jacobi, lookahead, recycling), or its
hidden states (Medusa, EAGLE), which the same forwards return (no second pass): those of
the prompt go to `proposer.prefilled`, those of the root and the kept path to
`proposer.update` (`Outcome.features`). Other methods pay nothing for it; where only
verification reads the logits, a runner may compute the head for the rows it reads
(`target.forward_rows`, `engine.verify.HeadRows`).

Invariant: the cache holds every context token except the last one, which is fed as
the first input of the next step. So a step that keeps `a` drafted tokens leaves
(len(context_before) - 1) + 1 + a positions in the cache.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from time import perf_counter

import torch

from pardec_cli.engine.cache import check_rollback_supported, keep_path
from pardec_cli.engine.events import FINISH_EOS, FINISH_LENGTH, StepEvent
from pardec_cli.engine.model import LanguageModel
from pardec_cli.engine.proposal import Draft, Outcome, Proposer, StartContext, fit_to_tiles
from pardec_cli.engine.sampling import SamplingParams, greedy_token, logits_to_probs, make_generator, sample_from
from pardec_cli.engine.verify import HeadRows, LazyRows, Verdict, verify_greedy, verify_sampling
from pardec_cli.errors import ContextOverflowError, PardecUsageError


def decode(
    target: LanguageModel,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    eos_token_ids: Collection[int] = (),
) -> Iterator[StepEvent]:
    """Generate up to `max_new_tokens` tokens after `prompt_ids`, one StepEvent per step.

    The last event has `finish_reason` "eos" or "length". A consumer may stop iterating
    at any time (stop strings, Ctrl-C); nothing needs cleaning up.
    """
    if not prompt_ids:
        raise PardecUsageError("the prompt is empty")
    if max_new_tokens < 1:
        raise PardecUsageError(f"max new tokens must be at least 1, got {max_new_tokens}")
    limit = target.max_context
    if limit is not None:
        if len(prompt_ids) >= limit:
            raise ContextOverflowError(
                f"the prompt is {len(prompt_ids)} tokens but the model's context holds {limit}",
                hint="shorten the prompt",
            )
        max_new_tokens = min(max_new_tokens, limit - len(prompt_ids))
    eos = frozenset(eos_token_ids)
    generator = make_generator(sampling, target.device)
    needs = proposer.needs()
    top_k = min(needs.top_k, target.vocab_size)
    layers = needs.feature_layers
    if layers:
        target.check_feature_layers(layers)

    def choose(logits_row: torch.Tensor) -> int:
        if sampling.greedy:
            return greedy_token(logits_row)
        return sample_from(logits_to_probs(logits_row, sampling), generator)

    # Every step runs under inference_mode, but the yields are outside it: a generator
    # suspended inside the context would leave inference mode on in the consumer's code
    # (and two interleaved generations would restore each other's modes out of order).
    with torch.inference_mode():
        start = perf_counter()
        proposer.start(StartContext(target, tuple(prompt_ids), sampling, generator))
        cache = target.new_cache(len(prompt_ids) + max_new_tokens)
        if layers:
            logits, features = target.forward_features(prompt_ids, cache, layers, last_only=True)  # [1, V], [P, F]
            proposer.prefilled(features)
        else:
            logits = target.forward(prompt_ids, cache, last_only=True)  # [1, V]
        if proposer.needs_rollback:
            check_rollback_supported(cache)
        first = choose(logits[-1])
    context = [*prompt_ids, first]
    produced = 1
    finish = _finish_reason((first,), produced, max_new_tokens, eos)
    now = perf_counter()
    yield StepEvent(index=0, tokens=(first,), drafted=0, accepted=0, propose_s=0.0, verify_s=now - start,
                    elapsed_s=now - start, finish_reason=finish)

    step = 0
    while finish is None:
        step += 1
        with torch.inference_mode():
            t0 = perf_counter()
            # Drafting past the token limit is wasted work: the extra tokens could never be emitted.
            draft = proposer.propose(context, max_new_tokens - produced - 1)
            draft = fit_to_tiles(draft, target.row_tile)  # no lone row past a tile of the target's matmuls
            t1 = perf_counter()
            # The root (context[-1]) goes at cache position len(context) - 1, its nodes after it.
            inputs = [context[-1], *draft.tokens]
            if layers:
                logits, features = target.forward_features(inputs, cache, layers, parents=draft.parents)  # [k+1, V], [k+1, F]
            elif top_k:
                logits, features = target.forward(inputs, cache, parents=draft.parents), None  # [k+1, V]
            else:  # only verification reads the rows: the head may run for those alone
                logits, features = target.forward_rows(inputs, cache, parents=draft.parents), None
            t_forward = perf_counter()
            verdict = _verify(draft, logits, sampling, generator)
            keep_path(cache, len(context), verdict.path)
            top_tokens = torch.topk(logits, top_k, dim=-1).indices if top_k else None  # [k+1, top_k]; a tensor then
            if features is not None:
                # The rows of the root and of each kept node: [1 + accepted, F].
                rows = torch.tensor([0, *(node + 1 for node in verdict.path)], device=features.device)
                features = features.index_select(0, rows)
            outcome = Outcome(
                accepted=verdict.accepted, path=verdict.path, top_tokens=top_tokens, features=features,
                # Alone, a proposer's draft is all of the step's inputs (a combination splits them).
                step_inputs=tuple(inputs) if top_k else (), step_top_tokens=top_tokens, forward_s=perf_counter() - t1,
            )
            tokens = verdict.tokens
            context.extend(tokens)
            proposer.update(context, draft, outcome)
        tokens, finish = _truncate(tokens, produced, max_new_tokens, eos)
        produced += len(tokens)
        t2 = perf_counter()
        accepted = min(verdict.accepted, len(tokens))
        yield StepEvent(index=step, tokens=tokens, drafted=len(draft.tokens), accepted=accepted, propose_s=t1 - t0,
                        verify_s=t2 - t1, elapsed_s=t2 - start, finish_reason=finish, arm=draft.arm,
                        forward_s=t_forward - t1)
    del cache


def _verify(draft: Draft, logits: torch.Tensor | HeadRows, sampling: SamplingParams, generator: torch.Generator | None) -> Verdict:
    if sampling.greedy:
        return verify_greedy(draft, logits)
    # A chain's rows are all on its one path: process them in one batch. A tree's walk
    # visits a few of its rows (and `HeadRows` computes the rows read): process those only.
    batch = draft.is_chain and isinstance(logits, torch.Tensor)
    rows = logits_to_probs(logits, sampling) if batch else LazyRows(logits, lambda row: logits_to_probs(row, sampling))
    return verify_sampling(draft, rows, generator)


def _finish_reason(tokens: Sequence[int], produced: int, limit: int, eos: frozenset[int]) -> str | None:
    if tokens and tokens[-1] in eos:
        return FINISH_EOS
    if produced >= limit:
        return FINISH_LENGTH
    return None


def _truncate(
    tokens: tuple[int, ...], produced: int, limit: int, eos: frozenset[int]
) -> tuple[tuple[int, ...], str | None]:
    """Cut a step's tokens at the first EOS (kept) or at the token limit."""
    for i, token in enumerate(tokens):
        if token in eos:
            tokens = tokens[: i + 1]
            break
    tokens = tokens[: limit - produced]
    return tokens, _finish_reason(tokens, produced + len(tokens), limit, eos)

