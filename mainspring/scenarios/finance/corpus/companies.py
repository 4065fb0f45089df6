"""The four fictional companies and the traps each carries. Names and tickers are made up; CIKs are in the
99000000NN range, which the SEC does not assign."""

from __future__ import annotations

from dataclasses import dataclass

FISCAL_YEARS = (2022, 2023, 2024)  # the years filed; FY2021 exists only as the prior-year comparatives
FIRST_YEAR = 2021


@dataclass(frozen=True)
class CompanySpec:
    cik: str
    ticker: str
    name: str
    possessive: str  # "Orbital Dynamics'" — how question text names it
    fiscal_year_end: str  # MMDD
    scale: int  # 1000: tables in thousands; 1_000_000: in millions
    segments: tuple[str, str]
    base_revenue: int  # first quarter's revenue, in table units
    ten_k_format: str = "md"
    other_format: str = "md"
    split_at: tuple[int, int] | None = None  # (fy, quarter) from which shares count 2-for-1
    restates: int | None = None  # the fiscal year whose 10-K a 10-K/A restates


COMPANIES: tuple[CompanySpec, ...] = (
    CompanySpec("9900000001", "ORBT", "Orbital Dynamics Inc.", "Orbital Dynamics'", "1231", 1000,
                ("Launch Services", "Satellite Components"), 180_000, restates=2023),
    CompanySpec("9900000002", "LMFS", "Lumenfield Software Inc.", "Lumenfield Software's", "0630", 1000,
                ("Subscriptions", "Professional Services"), 95_000, other_format="html"),
    CompanySpec("9900000003", "KSFH", "Kestrel Freight Holdings Corp.", "Kestrel Freight's", "1231", 1_000_000,
                ("Freight Brokerage", "Fleet Operations"), 2_400, ten_k_format="pdf"),
    CompanySpec("9900000004", "BWFC", "Brightwater Foods Corp.", "Brightwater Foods'", "1231", 1000,
                ("Packaged Foods", "Beverages"), 310_000, split_at=(2023, 3)),
)


def quarter_index(fy: int, quarter: int) -> int:
    """0 for FY2021 Q1 … 15 for FY2024 Q4."""
    return (fy - FIRST_YEAR) * 4 + quarter - 1
