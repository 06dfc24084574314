"""The parity check of a run's picked records (`text.reference`), beside the run.

Workers pick records and hand over what they made of them (`ChunkResult.to_check`); the step's
`check` encodes them again with the reference libraries and compares. Loading those libraries takes
~0.7 s (HF tokenizers) to ~2 s (transformers): a process that has not loaded them checks in a
process of its own, started with the run, which loads them while the workers work; one that holds
them already (a second run in the same process, as tests and Ray tasks make) checks here.
"""

from __future__ import annotations

from ..text.reference import CertificateError


class Certifier:
    def __init__(self, step, beside: bool) -> None:
        """`beside`: check in a process of its own (else here)."""
        self.step = step
        self.counts: dict[str, int] = {}
        self.side = None
        if beside and not step.reference_loaded():
            from .workers import SideProcess

            self.side = SideProcess(step.check)

    def add(self, items: list) -> None:
        """`items`: (where, what the worker made of a picked record), where being file:line."""
        if self.side is not None:
            self.side.send(items)
        else:
            self._take(self.step.check(items))

    def finish(self) -> dict[str, int]:
        """The summed counts of every check; CertificateError at the first mismatch."""
        if self.side is not None:
            for answer in self.side.answers():
                self._take(answer)
            self.side.end(kill=False)
            self.side = None
        return self.counts

    def end(self) -> None:
        if self.side is not None:
            self.side.end(kill=True)

    def _take(self, answer: tuple[dict, str | None]) -> None:
        counts, mismatch = answer
        if mismatch:
            raise CertificateError(f"{mismatch}; nothing was written (--no-certify writes it anyway, recorded as "
                                   "uncertified)")
        for name, count in counts.items():
            self.counts[name] = self.counts.get(name, 0) + count
