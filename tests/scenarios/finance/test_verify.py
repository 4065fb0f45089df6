"""The report verifier over the fixture corpus: a correct report passes; a wrong number, a missing citation, a
wrong-period citation and an unresolvable citation each fail it (fail closed)."""

from __future__ import annotations

from mainspring.scenarios.finance.filings import FilingsStore
from mainspring.scenarios.finance.verify import verify_report

from .conftest import ACCN_10K


def _ids(store: FilingsStore) -> dict[str, str]:
    return {"rev23": store.get_fact("Revenues", "ORBT", "FY2023").fact.fact_id,
            "rev22": store.get_fact("Revenues", "ORBT", "FY2022").fact.fact_id,
            "rev23_orig": store.get_fact("Revenues", "ORBT", "FY2023", accn=ACCN_10K).fact.fact_id,
            "q2": store.get_fact("Revenues", "ORBT", "FY2024Q2").fact.fact_id,
            "eps": store.get_fact("EarningsPerShareDiluted", "ORBT", "FY2023").fact.fact_id,
            "loss": store.get_fact("NetIncomeLoss", "ORBT", "FY2023").fact.fact_id}


def _span(store: FilingsStore, doc_id: str, page: int, needle: str) -> str:
    start = store.read(doc_id, page).index(needle)
    return f"[D:{doc_id} p.{page} c.{start}-{start + len(needle)}]"


def _good_report(store: FilingsStore) -> tuple[str, dict[str, str]]:
    f = _ids(store)
    programs = {"p-1": f"growth(F:{f['rev23']}, F:{f['rev22']})"}
    table = _span(store, "ORBT-10K-FY2023", 1, "1,234,456")
    md = (f"# Orbital Dynamics\n\n"
          f"1. Revenues in FY2023 were $1,250.0 million [F:{f['rev23']}] after the restatement, up from "
          f"$1.1 billion [F:{f['rev22']}] in FY2022, growth of 13.6% [P:p-1].\n"
          f"2. As first reported, revenues were $1,234.5 million {table}.\n"
          f"3. Diluted EPS was $0.45 per share [F:{f['eps']}] and the net loss $3.2 million [F:{f['loss']}].\n"
          f"4. In Q2 FY2024 revenues were $330.0 million [F:{f['q2']}].\n")
    return md, programs


def test_a_correct_report_passes(store: FilingsStore) -> None:
    md, programs = _good_report(store)
    verdict = verify_report(md, store, programs)
    assert [c.status for c in verdict.claims] == ["ok"] * 7, verdict.markdown
    assert verdict.verified
    assert "Verified" in verdict.markdown
    periods = [c.period for c in verdict.claims]
    assert periods[:3] == ["FY2023", "FY2022", "FY2022"] and periods[-1] == "FY2024Q2"


def test_a_wrong_number_fails(store: FilingsStore) -> None:
    md, programs = _good_report(store)
    verdict = verify_report(md.replace("$330.0 million", "$331.0 million"), store, programs)
    assert not verdict.verified
    (bad,) = [c for c in verdict.claims if c.status != "ok"]
    assert bad.status == "wrong_value" and bad.text == "$331.0 million" and bad.source_value == 330_000_000
    assert "$331.0 million" in verdict.markdown and "wrong_value" in verdict.markdown
    assert verify_report(md.replace("13.6%", "14.6%"), store, programs).claims[2].status == "wrong_value"


def test_a_missing_citation_fails(store: FilingsStore) -> None:
    md, programs = _good_report(store)
    md += "Gross margin was 41.2% for the year.\n"
    verdict = verify_report(md, store, programs)
    assert not verdict.verified
    assert [(c.text, c.status) for c in verdict.claims if c.status != "ok"] == [("41.2%", "uncited")]


def test_a_citation_in_another_sentence_does_not_count(store: FilingsStore) -> None:
    f = _ids(store)
    verdict = verify_report(f"Revenues were $330.0 million. See [F:{f['q2']}].", store, {})
    assert [c.status for c in verdict.claims] == ["uncited"]


def test_a_wrong_period_citation_fails(store: FilingsStore) -> None:
    f = _ids(store)
    # the fiscal 2024 second quarter's figure cited for the fiscal year 2023
    verdict = verify_report(f"In fiscal 2023 revenues were $330.0 million [F:{f['q2']}].", store, {})
    assert not verdict.verified
    (claim,) = verdict.claims
    assert claim.status == "wrong_period" and claim.period == "FY2023" and "FY2024Q2" in claim.reason


def test_an_unresolvable_citation_fails(store: FilingsStore) -> None:
    md, programs = _good_report(store)
    for broken in ("[F:f-0000000000]", "[D:ORBT-10K-FY2023 p.9 c.0-5]", "[P:p-7]", "[D:NOPE p.1 c.0-3]"):
        verdict = verify_report(f"Revenues were $330.0 million {broken}.", store, programs)
        assert [c.status for c in verdict.claims] == ["unresolved"], broken
        assert not verdict.verified
    orphan = verify_report(md + "\nSee also [F:f-0000000000].\n", store, programs)
    assert not orphan.verified and orphan.claims[-1].status == "unresolved" and orphan.claims[-1].text == ""
    failing_program = verify_report("Growth was 5% [P:p-1].", store, {"p-1": "divide(1, 0)"})
    assert failing_program.claims[0].status == "unresolved" and "division by zero" in failing_program.claims[0].reason


def test_an_empty_report_is_not_verified(store: FilingsStore) -> None:
    assert not verify_report("  ", store, {}).verified


def test_the_generated_corpus_round_trips_through_store_programs_and_verifier(tmp_path) -> None:
    """Every question of a generated corpus: its evidence facts resolve, its evidence passages are on the
    cited pages, and a one-line report of its answer, cited by fact or by its program, verifies."""

    from mainspring.scenarios.finance.corpus import generate_corpus, load_questions

    root = tmp_path / "generated"
    generate_corpus(root, seed=0)
    store = FilingsStore.open(root, tmp_path / "cache")
    checked = 0
    for q in load_questions(root):
        ids = [store.get_fact(e.fact.concept, e.fact.cik, e.fact.period, e.fact.unit, e.fact.accn).fact.fact_id
               for e in q.evidence if e.fact]
        for e in q.evidence:
            if e.text and e.page:
                assert e.text in store.read(e.doc_id, e.page), (q.id, e.doc_id, e.page)
        assert ids == [e.fact.fact_id for e in q.evidence if e.fact], q.id  # the generator names the store's facts
        if q.answer is None or not q.program:
            continue
        marker = f"[{q.program}]" if q.program == f"F:{ids[0]}" else "[P:p-1]"
        verdict = verify_report(f"The answer is {q.answer_text} {marker}.", store, {"p-1": q.program})
        assert verdict.verified, (q.id, q.answer_text, verdict.markdown)
        checked += 1
    store.close()
    assert checked >= 100


def test_the_stated_answer_must_be_one_of_the_verified_numbers(store: FilingsStore) -> None:
    from mainspring.scenarios.finance.verify import check_answer

    md, programs = _good_report(store)
    verdict = verify_report(md, store, programs)
    for answer in (1_250_000_000.0, 13.6, 0.45, 1_100_000_000.0):  # dollars, a percent, per share, "$1.1 billion"
        assert check_answer(verdict, md, answer).verified, answer
    assert check_answer(verdict, md, None) is verdict  # "not reported" states no figure
    wrong = check_answer(verdict, md, 1_260_000_000.0)
    assert not wrong.verified and wrong.claims[0].status == "answer_uncited"
    assert "answer_uncited" in wrong.markdown and len(wrong.claims) == len(verdict.claims) + 1
    bad = verify_report(md.replace("$330.0 million", "$331.0 million"), store, programs)
    assert not check_answer(bad, md, 331_000_000.0).verified  # printed, but not a verified number
    assert not check_answer(verify_report("Revenue rose.", store, {}), "Revenue rose.", 13.6).verified
