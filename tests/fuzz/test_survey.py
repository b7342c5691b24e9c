"""The refusal survey (tilec.testing.survey): its rows, its grouping of refusals by message class, its exit status."""
from __future__ import annotations

from tilec.testing import survey


def test_a_refused_program_is_a_row_and_a_class():
    rows = survey.survey(429, 430)  # a read of a running statistic (gen_nests): refused at its line
    assert [(r["seed"], r["cls"]) for r in rows] == [(429, "rejected")]
    text = survey.report(rows)
    assert text.splitlines()[0] == "1 programs: rejected 1"
    assert "inside the loop that accumulates" in text and "seeds [429]" in text


def test_messages_group_without_names_and_numbers():
    rows = [{"seed": s, "cls": "rejected", "stage": "compile",
             "msg": f"<string>:{s}:7: error: the compiler cannot map `Y{s}` to Trainium engines: the index `N{s} - i` "
                    f"of A{s}[0..{s}] is odd"} for s in (3, 4)] + [{"seed": 5, "cls": "ok", "stage": "", "msg": ""}]
    lines = survey.report(rows).splitlines()
    assert lines[0] == "3 programs: rejected 2, ok 1"
    assert lines[1].split()[:2] == ["2", "rejected"] and "seeds [3, 4]" in lines[1]
    assert survey.message_class(rows[0]["msg"]) == "the index `_` of AN[..] is odd"


def test_exit_status_is_zero_without_bugs(capsys):
    assert survey.main(["--start", "0", "--stop", "1"]) == 0
    assert "1 programs:" in capsys.readouterr().out
