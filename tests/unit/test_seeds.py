import pytest

from tests.seeds import seeds_from_env


def test_default_count_range_and_list(monkeypatch):
    monkeypatch.delenv("TG_SEEDS_T", raising=False)
    assert seeds_from_env("TG_SEEDS_T", [0, 10]) == [0, 10]
    cases = (("3", [0, 1, 2]), ("100-102", [100, 101, 102]), ("5,9,7", [5, 9, 7]), (" 4 ", [0, 1, 2, 3]))
    for raw, want in cases:
        monkeypatch.setenv("TG_SEEDS_T", raw)
        assert seeds_from_env("TG_SEEDS_T", []) == want


def test_another_form_is_refused_naming_the_variable_and_the_forms(monkeypatch):
    monkeypatch.setenv("TG_SEEDS_T", "100..120")
    with pytest.raises(ValueError, match=r"TG_SEEDS_T='100\.\.120'.*count N.*range A-B.*list a,b,c"):
        seeds_from_env("TG_SEEDS_T", [])
