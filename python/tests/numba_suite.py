"""Runs modules of Numba's own test suite (as its package installs them) and prints each
test's outcome as JSON: ``python numba_suite.py [--kiln] MODULE...``. With ``--kiln``,
Numba links through Kiln (``kiln.numba.enable()`` before anything is compiled)."""

import json
import sys
import unittest


class Outcomes(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}

    def addSuccess(self, test):
        super().addSuccess(test)
        self.outcomes[test.id()] = "passed"

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.outcomes[test.id()] = "failed"

    def addError(self, test, err):
        super().addError(test, err)
        self.outcomes[test.id()] = "error"

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skipped"

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.outcomes[test.id()] = "expected failure"

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "unexpected success"


def main(argv):
    if argv and argv[0] == "--kiln":
        import os

        import kiln.numba

        kiln.numba.enable()
        # The processes the tests start (the caching tests' second runs) too, through the
        # package's start-up hook.
        os.environ["KILN_NUMBA"] = "1"
        argv = argv[1:]
    suite = unittest.defaultTestLoader.loadTestsFromNames(argv)
    runner = unittest.TextTestRunner(resultclass=Outcomes, verbosity=0, stream=sys.stderr)
    result = runner.run(suite)
    print(json.dumps(result.outcomes))


if __name__ == "__main__":
    main(sys.argv[1:])
