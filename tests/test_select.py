"""`--method auto` on simulated hardware: the cost model, accelerators, tuned results.

Most tests use a small profile written here (so they do not move when the shipped
priors are re-measured); a few check the shipped profiles behave sensibly.
"""

from __future__ import annotations

import dataclasses

import pytest

from pardec_cli.selection.costmodel import CostCurve, ModelShape
from pardec_cli.hardware import CpuInfo, GpuInfo, describe
from pardec_cli.methods.options import MethodOption
from pardec_cli.methods.registry import METHODS, MethodSpec
from pardec_cli.selection.profiles import Candidate, Profile, get_profile
from pardec_cli.selection.selector import AutoSelector, ModelInfo, select, step_cost_ms
from pardec_cli.store.accelerators import InstalledAccelerator
from pardec_cli.selection.tuned import TunedCandidate, TunedProfile, TunedResults

SMOLLM2 = ModelShape(134_515_008, 30)
LLAMA_8B = ModelShape(8_030_000_000, 32)
AVX2 = CpuInfo("AMD EPYC", 2, frozenset({"avx2"}))
AMX = CpuInfo("Xeon", 2, frozenset({"avx2", "avx512f", "amx_bf16"}))

THIS_CPU = describe("cpu", "float32", AVX2)
CPU_FORCED_BF16 = describe("cpu", "bfloat16", AVX2)  # no bf16 hardware: every extra token costs ~13 ms
AMX_CPU = describe("cpu", "bfloat16", AMX)
H100 = describe("cuda:0", "bfloat16", AVX2, [GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 << 30, (9, 0))])
RTX_3060 = describe("cuda:0", "bfloat16", AVX2, [GpuInfo(0, "NVIDIA GeForce RTX 3060", 12 << 30, (8, 6))])

NARROW = Candidate("pld", {"num_draft": 4}, tokens_per_step=1.6, drafted=3.0, draft_ms=0.1)
MEDIUM = Candidate("suffix", {"max_nodes": 16}, tokens_per_step=2.2, drafted=16.0, draft_ms=1.0)
WIDE = Candidate("recycling", {"nodes": 64, "depth": 8}, tokens_per_step=2.8, drafted=64.0, draft_ms=1.0)
DRAFTER = Candidate("draft", {"k": 4}, tokens_per_step=3.0, drafted=4.5, draft_calls=5.0)


def profile(*candidates: Candidate, name: str = "test") -> Profile:
    return Profile(name, "test profile", {}, {"default": tuple(candidates)}, ("test",))


def curve(**points: float) -> CostCurve:
    return CostCurve.from_mapping({int(k[1:]): v for k, v in points.items()}, "measured in the test")


# -- the cost model -------------------------------------------------------------------


def test_the_expected_speedup_is_tokens_per_step_over_the_relative_step_cost() -> None:
    c = curve(n1=10.0, n8=15.0, n16=20.0)
    candidate = Candidate("pld", {}, tokens_per_step=2.0, drafted=7.0, draft_ms=1.0)
    assert step_cost_ms(candidate, c, accelerator_ms=0.0) == pytest.approx(16.0)
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(candidate), curve=c)
    assert choice.method == "pld"
    assert choice.estimate.speedup == pytest.approx(2.0 * 10.0 / 16.0)
    assert choice.estimate.step_cost == pytest.approx(1.6)


def test_after_a_long_prompt_every_drafted_row_costs_more_so_narrow_drafts_win() -> None:
    # After 300 tokens 8 rows cost 1.5x one; each row costs 1 ms more per 1000 tokens beyond.
    priced = dataclasses.replace(curve(n1=10.0, n8=15.0, n64=60.0), context_tokens=300, row_ms_per_1k=1.0)
    few = Candidate("pld", {"num_draft": 2}, tokens_per_step=1.8, drafted=1.0)
    many = Candidate("suffix", {"max_nodes": 8}, tokens_per_step=2.6, drafted=7.0)
    short = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(few, many), curve=priced, context=200)
    long = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(few, many), curve=priced, context=4300)
    assert (short.method, long.method) == ("suffix", "pld")
    # 4 ms more per row after 4300 tokens: 8 rows 15 + 32 ms against one row's 14
    assert next(e for e in long.ranking if e.method == "suffix").step_cost == pytest.approx((15.0 + 8 * 4.0) / 14.0)
    assert "context   priors priced after this prompt's 4300 tokens" in long.explain()
    assert "context" not in short.explain()


def test_a_method_that_sizes_its_own_drafts_is_priced_as_measured_whatever_the_prompt() -> None:
    # pld's fit drafts fewer rows where rows cost more: its prior of drafted rows is not
    # priced for the text's length, a fixed-size draft's is.
    priced = dataclasses.replace(curve(n1=10.0, n8=15.0, n64=60.0), context_tokens=300, row_ms_per_1k=1.0)
    fit = Candidate("pld", {"num_draft": 16, "fit": True}, tokens_per_step=2.0, drafted=3.0)
    fixed = Candidate("suffix", {"max_nodes": 8}, tokens_per_step=2.0, drafted=2.0)
    short = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(fit, fixed), curve=priced, context=300)
    long = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(fit, fixed), curve=priced, context=4300)
    speed = {c.label: {e.label: e.speedup for e in c.ranking} for c in (short, long)}
    fit_label, fixed_label = "pld[fit=true,num_draft=16]", "suffix[max_nodes=8]"
    assert speed[short.label][fit_label] == speed[long.label][fit_label]
    assert speed[long.label][fixed_label] < speed[short.label][fixed_label]
    assert (short.method, long.method) == ("suffix", "pld")


def test_the_selector_prices_priors_for_the_prompt_it_chooses_for() -> None:
    priced = dataclasses.replace(curve(n1=10.0, n8=15.0, n64=60.0), context_tokens=300, row_ms_per_1k=1.0)
    info = ModelInfo("smollm2-135m", SMOLLM2, "sha256:test")
    chooser = AutoSelector(THIS_CPU, info, profiles={"test": profile(NARROW)}, learned_curve=priced,
                           count_tokens=lambda text: len(text.split()))
    short, long = chooser.choose("word " * 10, "test"), chooser.choose("word " * 3000, "test")
    assert (short.context, long.context) == (10, 3000)
    assert long.estimate.speedup < short.estimate.speedup

    def never(text: str) -> int:
        raise AssertionError("a curve that does not price text needs no token count")

    unpriced = AutoSelector(THIS_CPU, info, profiles={"test": profile(NARROW)}, learned_curve=curve(n1=10.0, n8=15.0),
                            count_tokens=never)
    assert unpriced.choose("word " * 3000, "test").context == 0


def test_plain_decoding_wins_when_nothing_is_expected_to_beat_it() -> None:
    c = curve(n1=10.0, n8=40.0)  # verifying costs dearly
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW), curve=c)
    assert choice.method == "vanilla" and choice.estimate.basis == "baseline"
    assert "no candidate is expected to beat plain decoding" in choice.explain()


def test_on_equal_expectations_the_profile_order_decides() -> None:
    a = Candidate("pld", {"num_draft": 4}, tokens_per_step=2.0, drafted=1.0)
    b = Candidate("suffix", {}, tokens_per_step=2.0, drafted=1.0)
    flat = curve(n1=10.0, n64=10.0)
    assert select(hardware=H100, model=SMOLLM2, profile=profile(a, b), curve=flat).method == "pld"
    assert select(hardware=H100, model=SMOLLM2, profile=profile(b, a), curve=flat).method == "suffix"


# -- simulated hardware ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("hardware", "model", "expected"),
    [
        (H100, LLAMA_8B, "recycling"),  # verifying 65 tokens costs about as much as one: widest
        (RTX_3060, LLAMA_8B, "suffix"),  # 17 tokens ~1.2x one, 65 ~1.8x: medium width
        (AMX_CPU, SMOLLM2, "suffix"),  # AMX bf16: about the same
        (THIS_CPU, SMOLLM2, "pld"),  # AVX2 float32: 17 tokens ~2x one: narrow
        (CPU_FORCED_BF16, SMOLLM2, "vanilla"),  # emulated bf16: even 4 tokens ~2x one
    ],
    ids=["h100", "consumer-gpu", "amx-cpu", "this-cpu-fp32", "cpu-without-bf16-in-bf16"],
)
def test_width_pays_where_verification_is_cheap(hardware, model, expected) -> None:
    choice = select(hardware=hardware, model=model, profile=profile(NARROW, MEDIUM, WIDE))
    assert choice.method == expected, choice.explain()


def test_a_measured_curve_overrides_the_estimate() -> None:
    flat = curve(n1=50.0, n64=55.0)  # as if tune found this CPU cheap to widen
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW, WIDE), curve=flat)
    assert choice.method == "recycling"
    assert "measured in the test" in choice.explain()


def test_the_shipped_profiles_choose_a_drafting_method_on_this_cpu_and_on_an_h100() -> None:
    for name in ("code", "chat", "extraction"):
        for hardware, model in ((THIS_CPU, SMOLLM2), (H100, LLAMA_8B)):
            choice = select(hardware=hardware, model=model, profile=get_profile(name))
            assert choice.method != "vanilla", choice.explain()
            assert choice.estimate.speedup > 1.0


def test_the_shipped_profiles_choose_wider_drafts_on_an_h100_than_on_this_cpu() -> None:
    for name in ("code", "chat", "extraction"):
        cpu = select(hardware=THIS_CPU, model=SMOLLM2, profile=get_profile(name))
        gpu = select(hardware=H100, model=LLAMA_8B, profile=get_profile(name))
        drafted = {e.label: e for e in gpu.ranking}
        assert gpu.estimate.step_cost <= 1.5
        assert next(c for c in get_profile(name).candidates_for(H100) if c.label == gpu.label).drafted > next(
            c for c in get_profile(name).candidates_for(THIS_CPU) if c.label == cpu.label
        ).drafted, (cpu.label, gpu.label, drafted)


# -- accelerators -----------------------------------------------------------------------


def test_a_method_that_needs_a_missing_accelerator_is_skipped_with_a_reason() -> None:
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW, DRAFTER))
    assert choice.method == "pld"
    assert ("draft[k=4]", "needs a drafter for this model; none is installed") in choice.skipped


def test_an_installed_drafter_is_used_and_named_in_the_knobs() -> None:
    drafter = InstalledAccelerator("drafter", "smollm2-135m", None, SMOLLM2.parameters, SMOLLM2.layers)
    choice = select(hardware=THIS_CPU, model=ModelShape(1_711_000_000, 24), profile=profile(NARROW, DRAFTER),
                    accelerators=[drafter])
    assert choice.method == "draft"
    assert choice.knobs == {"k": 4, "model": "smollm2-135m"}
    assert choice.estimate.accelerator == "smollm2-135m"


def test_of_several_drafters_the_cheaper_one_wins() -> None:
    small = InstalledAccelerator("drafter", "small", None, 135_000_000, 30)
    big = InstalledAccelerator("drafter", "big", None, 1_000_000_000, 24)
    choice = select(hardware=THIS_CPU, model=LLAMA_8B, profile=profile(DRAFTER), accelerators=[big, small])
    assert choice.knobs["model"] == "small"
    assert {e.knobs.get("model") for e in choice.ranking} == {"small", "big", None}


def test_a_drafter_as_big_as_the_target_does_not_pay() -> None:
    twin = InstalledAccelerator("drafter", "twin", None, SMOLLM2.parameters, SMOLLM2.layers)
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(DRAFTER), accelerators=[twin])
    assert choice.method == "vanilla"


def test_methods_this_pardec_does_not_have_are_skipped_gracefully() -> None:
    hydra = Candidate("hydra", {}, tokens_per_step=4.0, drafted=24.0, draft_calls=6.0)
    choice = select(hardware=H100, model=LLAMA_8B, profile=profile(NARROW, hydra))
    assert choice.method == "pld"
    assert ("hydra", "not a method of this pardec version") in choice.skipped


@pytest.mark.parametrize(("measured", "wins"), [(1.45, False), (4.5, True)])
def test_trained_heads_enter_with_their_own_measured_tokens_per_step(measured: float, wins: bool) -> None:
    """Heads trained here carry their measured agreement; it replaces the method's prior
    (weak CPU-trained heads must not win on a published paper's number)."""
    eagle = Candidate("eagle", {}, tokens_per_step=4.0, drafted=10.0, draft_calls=5.0, draft_ms=2.0)
    heads = [InstalledAccelerator("eagle", "eagle heads (trained)", None, tokens_per_step=measured)]
    choice = select(hardware=H100, model=LLAMA_8B, profile=profile(NARROW, eagle), accelerators=heads)
    assert (choice.method == "eagle") is wins
    [estimate] = [e for e in choice.ranking if e.method == "eagle"]
    assert estimate.tokens_per_step == measured and estimate.accelerator == "eagle heads (trained)"


def test_expected_tokens_per_step_of_trained_heads_chains_their_agreement() -> None:
    from pardec_cli.store.heads import expected_tokens_per_step

    assert expected_tokens_per_step({"eval": {"top1_per_depth": [0.5, 0.4]}}) == pytest.approx(1 + 0.5 + 0.5 * 0.4)
    assert expected_tokens_per_step({"kind": "eagle"}) is None


def test_a_method_registered_later_is_picked_up_without_changes_to_the_selector() -> None:
    """A new method only needs a registry entry naming its accelerator kind, a profile
    candidate, and an installed accelerator of that kind."""
    methods = {
        **METHODS,
        "eagle": MethodSpec("eagle", "EAGLE heads", "nowhere:Eagle", (MethodOption("depth", int, 6, "tree depth"),),
                            accelerator="eagle"),
    }
    eagle = Candidate("eagle", {"depth": 6}, tokens_per_step=4.0, drafted=24.0, draft_calls=6.0)
    heads = [InstalledAccelerator("eagle", "yuhuili/EAGLE-test", None, 250_000_000, 1)]
    without = select(hardware=H100, model=LLAMA_8B, profile=profile(NARROW, eagle), methods=methods)
    assert without.method == "pld"  # registered, but its heads are not installed
    with_heads = select(hardware=H100, model=LLAMA_8B, profile=profile(NARROW, eagle), methods=methods, accelerators=heads)
    assert with_heads.method == "eagle" and with_heads.knobs == {"depth": 6}


def test_an_accelerator_of_unknown_size_is_costed_as_a_share_of_the_target() -> None:
    mystery = InstalledAccelerator("drafter", "mystery")
    choice = select(hardware=THIS_CPU, model=LLAMA_8B, profile=profile(DRAFTER), accelerators=[mystery])
    assert choice.method == "draft" and choice.knobs["model"] == "mystery"


# -- sampling and tuned results -----------------------------------------------------------


def test_sampling_discounts_the_extra_tokens_of_deterministic_drafts() -> None:
    greedy = select(hardware=H100, model=LLAMA_8B, profile=profile(WIDE))
    sampled = select(hardware=H100, model=LLAMA_8B, profile=profile(WIDE), greedy=False)
    assert sampled.estimate.tokens_per_step < greedy.estimate.tokens_per_step
    explicit = dataclasses.replace(WIDE, sampled_tokens_per_step=2.5)
    assert select(hardware=H100, model=LLAMA_8B, profile=profile(explicit), greedy=False).estimate.tokens_per_step == 2.5


def tuned(*candidates: TunedCandidate) -> TunedProfile:
    return TunedProfile("test", list(candidates), best=candidates[0].label if candidates else None, complete=True)


def measured(method: str, knobs: dict, speedup: float, tokens: float = 2.0) -> TunedCandidate:
    return TunedCandidate(method, knobs, tokens, 4.0, 0.5, 20.0 * speedup, speedup, 8, 8)


def test_tuned_measurements_replace_the_priors_of_the_configurations_they_cover() -> None:
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW, WIDE),
                    tuned=tuned(measured("recycling", {"nodes": 12}, 1.4), measured("pld", {"num_draft": 6}, 1.2)))
    assert choice.label == "recycling[nodes=12]"
    assert choice.estimate.basis == "measured" and choice.estimate.speedup == pytest.approx(1.4)
    # Every measured configuration competes (best first), and then the baseline; the
    # priors follow, below them all.
    assert [e.label for e in choice.ranking[:3]] == ["recycling[nodes=12]", "pld[num_draft=6]", "vanilla"]
    assert [e.basis for e in choice.ranking[3:]] == ["prior", "prior"]
    assert "expect    measured 1.40x (1.40-1.40) over 8 runs (tune)" in choice.explain()


def test_a_measured_loss_is_believed_over_an_optimistic_prior() -> None:
    choice = select(hardware=H100, model=LLAMA_8B, profile=profile(NARROW, WIDE),
                    tuned=tuned(measured("recycling", {"nodes": 64, "depth": 8}, 0.9)))
    # Measured slower than plain decoding: plain decoding wins, and pld's unmeasured
    # prior cannot, however good it looks (a prior only wins where nothing was measured).
    assert choice.method == "vanilla"
    assert "no candidate is measured to beat plain decoding" in choice.explain()


def test_a_configuration_measured_by_tune_beats_a_better_looking_prior() -> None:
    """The case from the field: after `pardec tune -P code --methods pld` measured
    pld[num_draft=8] at 1.60x, auto still picked suffix+recycling on its 1.71x prior."""
    pld8 = Candidate("pld", {"num_draft": 8}, tokens_per_step=2.06, drafted=4.5, draft_ms=0.09)
    combo = Candidate("suffix+recycling", {"suffix.max_nodes": 8, "recycling.nodes": 8, "recycling.depth": 4},
                      tokens_per_step=2.6, drafted=6.0, draft_ms=0.8)
    flat = curve(n1=10.0, n8=10.5, n16=11.0)
    untuned = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(combo, pld8), curve=flat)
    assert untuned.method == "suffix+recycling" and untuned.estimate.basis == "prior"
    prior_combo = untuned.estimate.speedup
    tuned_choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(combo, pld8), curve=flat,
                          tuned=tuned(measured("pld", {"num_draft": 8}, 1.60)))
    assert tuned_choice.label == "pld[num_draft=8]" and tuned_choice.estimate.basis == "measured"
    assert prior_combo > 1.60
    assert tuned_choice.ranking[-1].speedup == pytest.approx(prior_combo)  # ranked last all the same
    text = tuned_choice.explain()
    assert "measured 1.60x" in text and f"suffix+recycling[recycling.depth=4,recycling.nodes=8,suffix.max_nodes=8] prior {prior_combo:.2f}x" in text


def test_a_measurement_on_few_runs_counts_for_less_than_one_on_many() -> None:
    one_lucky = TunedCandidate("suffix", {"max_nodes": 16}, 2.0, 4.0, 0.5, 36.0, 1.8, 1, 1)
    steady = TunedCandidate("pld", {"num_draft": 8}, 2.0, 4.0, 0.5, 32.0, 1.6, 8, 8)
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW), tuned=tuned(one_lucky, steady))
    assert choice.label == "pld[num_draft=8]"
    assert choice.ranking[1].label == "suffix[max_nodes=16]" and choice.ranking[1].speedup == pytest.approx(1.8)


def test_priors_are_discounted_by_how_wrong_they_were_on_this_machine() -> None:
    from pardec_cli.selection.selector import prior_discount

    assert prior_discount([]) is None
    assert prior_discount([(1.0, 2.0, 4)]) == pytest.approx(0.5)
    assert prior_discount([(1.0, 2.0, 1), (2.0, 2.0, 1)]) == pytest.approx(0.5 ** 0.5)  # geometric mean
    assert prior_discount([(3.0, 1.5, 4)]) == 1.0  # pessimistic priors are not raised
    assert prior_discount([(0.1, 2.0, 4)]) == pytest.approx(0.25)  # nor dropped below a quarter
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW), curve=curve(n1=10.0, n4=11.0),
                    discount=0.5, discount_basis="measured / prior over 1 configuration")
    plain = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW), curve=curve(n1=10.0, n4=11.0))
    estimate = next(e for e in choice.ranking if e.method == "pld")
    assert estimate.speedup == pytest.approx(plain.estimate.speedup * 0.5)
    assert f"prior {plain.estimate.speedup:.2f}x, discounted to {estimate.speedup:.2f}x" in choice.explain()
    assert "discount  priors x0.50: measured / prior over 1 configuration" in choice.explain()


def test_tuned_methods_whose_accelerator_went_away_are_skipped() -> None:
    choice = select(hardware=THIS_CPU, model=SMOLLM2, profile=profile(NARROW),
                    tuned=tuned(measured("draft", {"model": "gone", "k": 4}, 2.0)))
    assert choice.method != "draft"


# -- the session-level API ------------------------------------------------------------------


def selector(hardware=THIS_CPU, tuned_results=None, notes=()) -> AutoSelector:
    from pardec_cli.selection.profiles import load_profiles

    info = ModelInfo("smollm2-135m", SMOLLM2, "sha256:test")
    return AutoSelector(hardware, info, profiles=load_profiles(), tuned=tuned_results, notes=notes)


def test_choose_detects_the_task_and_explains_it() -> None:
    choice = selector().choose("Write a Python function that reverses a list.")
    assert choice.profile == "code" and choice.task is not None
    text = choice.explain()
    assert text.startswith(f"auto: {choice.label}")
    for fragment in ("profile   code (detected: ", "hardware  cpu: AMD EPYC (2 cores), float32", "cost      verifying",
                     "expect    "):
        assert fragment in text


def test_choose_with_a_given_profile_does_not_detect() -> None:
    choice = selector().choose("Write a Python function.", "chat")
    assert choice.profile == "chat" and choice.task is None
    assert "profile   chat (given)" in choice.explain()


def test_choose_uses_tuned_results_for_its_profile_and_their_curve() -> None:
    results = TunedResults("smollm2-135m", "sha256:test", THIS_CPU.key, "float32",
                           curve=curve(n1=40.0, n8=60.0, n64=200.0),
                           profiles={"chat": TunedProfile("chat", [measured("suffix", {"max_nodes": 12}, 2.5)], "suffix[max_nodes=12]")})
    chat = selector(tuned_results=results).choose("Tell me about the moon.", "chat")
    assert chat.label == "suffix[max_nodes=12]" and chat.estimate.basis == "measured"
    assert any(e.basis == "prior" and e.method == "pld" for e in chat.ranking)  # tune did not measure pld
    code = selector(tuned_results=results).choose("x", "code")
    assert code.curve.source == "measured in the test"  # the curve is the device's, for every profile
    assert all(e.basis in ("prior", "baseline") for e in code.ranking)


def test_what_one_profile_measured_discounts_the_priors_of_another() -> None:
    from pardec_cli.selection.selector import prior_estimates
    from pardec_cli.methods.registry import METHODS

    base = selector()
    c = curve(n1=40.0, n8=60.0, n64=200.0)
    code_priors = prior_estimates(hardware=THIS_CPU, model=SMOLLM2, profile=base.profiles["code"], greedy=True,
                                  accelerators=[], curve=c, methods=METHODS)
    first = code_priors[0]
    half = measured(first.method, first.knobs, first.speedup / 2, first.tokens_per_step)
    results = TunedResults("smollm2-135m", "sha256:test", THIS_CPU.key, "float32", curve=c,
                           profiles={"code": TunedProfile("code", [half], half.label)})
    chat = selector(tuned_results=results).choose("Tell me about the moon.", "chat")
    assert chat.discount == pytest.approx(0.5)
    assert all(e.prior is not None and e.speedup == pytest.approx(e.prior * 0.5) for e in chat.ranking if e.basis == "prior")


def test_notes_about_unusable_tuned_results_reach_the_explanation() -> None:
    note = "tuned results in /x.toml are for another device (cuda:NVIDIA H100): not used"
    assert f"note      {note}" in selector(notes=[note]).choose("hi").explain()
