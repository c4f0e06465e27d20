"""The log parsers on console output shaped as the real runners print it, and the verdict
read from a log: a listed test the log does not show counts as failed."""

from __future__ import annotations

import pytest

from clotho.swe.instance import SweInstance
from clotho.swe.log_parsers import OUTCOME, PARSERS, get_parser, parse_log
from clotho.swe.runner import TestCase as Case
from clotho.swe.runner import outcomes
from clotho.swe.verify import score

PYTEST_RA = """\
============================= test session starts ==============================
platform linux -- Python 3.9.20, pytest-8.3.3, pluggy-1.5.0
rootdir: /testbed
configfile: setup.cfg
collected 6 items

tests/test_calc.py ..F.sx                                                  [100%]

=================================== FAILURES ===================================
______________________________ test_median_even _______________________________
    def test_median_even():
>       assert median([1, 2, 3, 4]) == 2.5
E       assert 3 == 2.5
tests/test_calc.py:32: AssertionError
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_calc.py::test_mean
PASSED tests/test_calc.py::test_clamp[high edge]
PASSED tests/test_calc.py::test_power
SKIPPED [1] tests/test_calc.py:40: needs numpy
XFAIL tests/test_calc.py::test_future - not yet
FAILED tests/test_calc.py::test_median_even - assert 3 == 2.5
ERROR tests/test_calc.py::test_running_sum - fixture 'tmpdir_factory' not found
============= 1 failed, 3 passed, 1 skipped, 1 xfailed, 1 error in 0.12s ==============
"""


def test_pytest_short_summary() -> None:
    found = parse_log("pytest", PYTEST_RA)
    assert found["tests/test_calc.py::test_mean"] == "PASSED"
    assert found["tests/test_calc.py::test_power"] == "PASSED"
    assert found["tests/test_calc.py::test_future"] == "XFAIL"
    assert found["tests/test_calc.py::test_median_even"] == "FAILED"
    assert found["tests/test_calc.py::test_running_sum"] == "ERROR"
    # The id with a space: under the reference harness's first-word key and whole.
    assert found["tests/test_calc.py::test_clamp[high"] == "PASSED"
    assert found["tests/test_calc.py::test_clamp[high edge]"] == "PASSED"
    # `SKIPPED [1] file:line` counts skips; [1] is no test, and the message is no id.
    assert "[1]" not in found
    assert not any(key.startswith("assert") or "tmpdir" in key for key in found)


def test_pytest_teardown_error_after_a_pass_is_an_error() -> None:
    log = "PASSED tests/t.py::test_a\nERROR tests/t.py::test_a - teardown failed\n"
    assert parse_log("pytest", log) == {"tests/t.py::test_a": "ERROR"}
    swapped = "\n".join(reversed(log.splitlines()))
    assert parse_log("pytest", swapped) == {"tests/t.py::test_a": "ERROR"}


def test_pytest_options_shortens_absolute_path_parameters() -> None:
    log = (
        "PASSED tests/test_utils.py::test_get_netrc_auth[/tmp/pytest-of-root/p0/netrc]\n"
        "FAILED tests/test_utils.py::test_requote[http://x//y] - AssertionError\n"
    )
    found = parse_log("requests", log)
    assert found["tests/test_utils.py::test_get_netrc_auth[/netrc]"] == "PASSED"
    assert found["tests/test_utils.py::test_requote[http://x//y]"] == "FAILED"
    assert parse_log("pytest_options", log) == found


def test_pytest_v2_strips_colours_and_reads_verbose_lines() -> None:
    log = (
        "\x1b[32mPASSED\x1b[0m sklearn/tests/test_base.py::test_clone\n"
        "FAILED sklearn/tests/test_base.py::test_repr[with space] - ValueError: x\n"
        "astropy/io/tests/test_x.py::test_read[a b] PASSED\n"
        "astropy/io/tests/test_x.py::test_write FAILED\n"
    )
    found = parse_log("astropy", log)
    assert found == {
        "sklearn/tests/test_base.py::test_clone": "PASSED",
        "sklearn/tests/test_base.py::test_repr[with space]": "FAILED",
        "astropy/io/tests/test_x.py::test_read[a b]": "PASSED",
        "astropy/io/tests/test_x.py::test_write": "FAILED",
    }
    assert parse_log("sphinx", log) == found == parse_log("scikit", log)


def test_matplotlib_names_mouse_buttons_by_value() -> None:
    log = "PASSED lib/matplotlib/tests/test_widgets.py::test_span_selector[MouseButton.LEFT]\n"
    found = parse_log("matplotlib", log)
    assert found == {"lib/matplotlib/tests/test_widgets.py::test_span_selector[1]": "PASSED"}


def test_seaborn_reads_progress_and_summary_lines() -> None:
    log = (
        "tests/test_core.py::TestHue::test_map PASSED [ 10%]\n"
        "tests/test_core.py::TestHue::test_bad FAILED [ 20%]\n"
        "FAILED tests/test_core.py::TestHue::test_bad - AssertionError\n"
        "PASSED tests/test_core.py::TestHue::test_other\n"
    )
    found = parse_log("seaborn", log)
    assert found == {
        "tests/test_core.py::TestHue::test_map": "PASSED",
        "tests/test_core.py::TestHue::test_bad": "FAILED",
        "tests/test_core.py::TestHue::test_other": "PASSED",
    }


DJANGO = """\
Testing against Django installed in '/testbed/django'
Importing application auth_tests
Skipping setup of unused database(s): other.
Operations to perform:
  Synchronize unmigrated apps: auth, auth_tests, contenttypes
System check identified no issues (0 silenced).
test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok
test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests) ... FAIL
test_help_text (auth_tests.test_validators.MinimumLengthValidatorTest) ... ERROR
test_sqlite_only (auth_tests.test_validators.DbTests) ... skipped 'Database has feature(s) x'
test_slow_output (auth_tests.test_validators.NoisyTests) ... Some printed noise
ok
test_validate (auth_tests.test_validators.Django4Tests.test_validate) ... ok

======================================================================
FAIL: test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)
----------------------------------------------------------------------
Traceback (most recent call last):
AssertionError: ValidationError not raised

----------------------------------------------------------------------
Ran 6 tests in 0.012s

FAILED (failures=1, errors=1, skipped=1)
"""


def test_django_runner_lines() -> None:
    found = parse_log("django", DJANGO)
    cls = "auth_tests.test_validators"
    assert found[f"test_ascii_validator ({cls}.UsernameValidatorsTests)"] == "PASSED"
    assert found[f"test_unicode_validator ({cls}.UsernameValidatorsTests)"] == "FAILED"
    assert found[f"test_help_text ({cls}.MinimumLengthValidatorTest)"] == "ERROR"
    assert found[f"test_sqlite_only ({cls}.DbTests)"] == "SKIPPED"
    assert found[f"test_slow_output ({cls}.NoisyTests)"] == "PASSED"  # `ok` a line later
    assert found[f"test_validate ({cls}.Django4Tests.test_validate)"] == "PASSED"
    # The reference harness keys the FAIL: header by its first word as well.
    assert found["test_unicode_validator"] == "FAILED"


SYMPY = """\
============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
random seed:        41207683
hash randomization: on (PYTHONHASHSEED=3719245930)

sympy/matrices/tests/test_matrices.py[4]
test_args ok
test_division F
test_sum E
test_slow_one f

________________________________________________________________________________
_________ sympy/matrices/tests/test_matrices.py:test_division __________________
Traceback (most recent call last):
AssertionError

= tests finished: 1 passed, 1 failed, 1 expected to fail, 1 exceptions, in 0.50 seconds =
DO *NOT* COMMIT!
"""


def test_sympy_runner_lines() -> None:
    found = parse_log("sympy", SYMPY)
    assert found["test_args"] == "PASSED"
    assert found["test_division"] == "FAILED"
    assert found["test_sum"] == "ERROR"
    assert found["sympy/matrices/tests/test_matrices.py:test_division"] == "FAILED"
    assert "test_slow_one" not in found  # an expected failure the reference does not read


def test_unittest_and_swesmith_formats() -> None:
    unittest_log = (
        "test_slugify (test.TestSlugify.test_slugify) ... ok\n"
        "test_max_length (test.TestSlugify.test_max_length) ... FAIL\n"
        "test_unicode (test.TestSlugify.test_unicode) ... skipped 'py2 only'\n"
        "test_known_bug (test.TestSlugify.test_known_bug) ... expected failure\n"
        "ERROR: test_io (test.TestIO.test_io)\n"
    )
    found = parse_log("unittest", unittest_log)
    assert found == {
        "test_slugify (test.TestSlugify.test_slugify)": "PASSED",
        "test_max_length (test.TestSlugify.test_max_length)": "FAILED",
        "test_unicode (test.TestSlugify.test_unicode)": "SKIPPED",
        "test_known_bug (test.TestSlugify.test_known_bug)": "XFAIL",
        "test_io (test.TestIO.test_io)": "ERROR",
    }
    verbose = (
        "tests/test_addict.py::DictTests::test_set_one_level_item PASSED     [  1%]\n"
        "tests/test_addict.py::test_param[a b] FAILED                         [  2%]\n"
    )
    found = parse_log("pytest_verbose", verbose)
    assert found["tests/test_addict.py::DictTests::test_set_one_level_item"] == "PASSED"
    assert found["tests/test_addict.py::test_param[a b]"] == "FAILED"
    xdist = "[gw1] PASSED tests/test_core.py::test_grad\n[gw0] FAILED tests/test_x.py::test_y\n"
    assert parse_log("pytest_xdist", xdist) == {
        "tests/test_core.py::test_grad": "PASSED",
        "tests/test_x.py::test_y": "FAILED",
    }


def test_every_reference_parser_name_is_registered() -> None:
    names = [
        "parse_log_pytest", "parse_log_pytest_options", "parse_log_django",
        "parse_log_pytest_v2", "parse_log_seaborn", "parse_log_sympy",
        "parse_log_matplotlib", "parse_log_astroid", "parse_log_flask",
        "parse_log_marshmallow", "parse_log_pvlib", "parse_log_pyvista",
        "parse_log_sqlfluff", "parse_log_xarray", "parse_log_pydicom",
        "parse_log_requests", "parse_log_pylint", "parse_log_astropy",
        "parse_log_scikit", "parse_log_sphinx",
    ]  # fmt: skip
    for name in names:
        assert get_parser(name) is PARSERS[name.removeprefix("parse_log_")]
    with pytest.raises(KeyError, match="unknown log parser 'nose'"):
        get_parser("nose")


def _instance(f2p: list[str], p2p: list[str]) -> SweInstance:
    return SweInstance(
        instance_id="x__y-1",
        repo="x/y",
        base_commit="abcdef0",
        problem_statement="p",
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
    )


def _verdict(instance: SweInstance, parser: str, log: str) -> tuple[float, dict]:
    cases = [Case(ids={t}, outcome=OUTCOME[s], nodeid=t) for t, s in parse_log(parser, log).items()]
    tests = outcomes(instance.FAIL_TO_PASS + instance.PASS_TO_PASS, cases)
    return score(instance, tests, "binary")[0], tests


def test_a_listed_test_absent_from_the_log_counts_as_failed() -> None:
    """As with JUnit: a test the log does not show did not run, and did not pass."""
    instance = _instance(
        ["tests/test_calc.py::test_mean"],
        ["tests/test_calc.py::test_power", "tests/test_calc.py::test_never_ran"],
    )
    reward, tests = _verdict(instance, "pytest", PYTEST_RA)
    assert tests["tests/test_calc.py::test_never_ran"] == {"outcome": "not collected"}
    assert tests["tests/test_calc.py::test_mean"]["outcome"] == "passed"
    assert reward == 0.0
    # Listed all present and passing (an XFAIL counts as passing, as for SWE-bench): 1.
    instance = _instance(["tests/test_calc.py::test_mean"], ["tests/test_calc.py::test_future"])
    assert _verdict(instance, "pytest", PYTEST_RA)[0] == 1.0
    # A failing, erroring or skipped listed test is no pass.
    for test in ("test_median_even", "test_running_sum"):
        instance = _instance([f"tests/test_calc.py::{test}"], [])
        assert _verdict(instance, "pytest", PYTEST_RA)[0] == 0.0
    instance = _instance(["test_args"], ["test_slow_one"])
    assert _verdict(instance, "sympy", SYMPY)[0] == 0.0
    assert _verdict(_instance(["test_args"], []), "sympy", SYMPY)[0] == 1.0
    assert _verdict(_instance(["test_args"], []), "sympy", "")[0] == 0.0
