"""The three statements of one company, quarter by quarter, built by identity from seeded drivers.

Amounts are integers in the company's table units (thousands or millions of dollars, and of shares), so every
figure a filing prints is exact and facts.json (whole units) is the printed figure times the scale. Every
balance-sheet change goes through the cash-flow statement, so Assets = Liabilities + Equity and
begin cash + CFO + CFI + CFF = end cash hold in every quarter without a plug.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mainspring.scenarios.finance.corpus.companies import CompanySpec

QUARTERS = 16  # FY2021 Q1 … FY2024 Q4

FLOWS = ("Revenues", "CostOfRevenue", "GrossProfit", "ResearchAndDevelopmentExpense",
         "SellingGeneralAndAdministrativeExpense", "OperatingExpenses", "OperatingIncomeLoss", "InterestExpense",
         "IncomeLossFromContinuingOperationsBeforeIncomeTaxesExtraordinaryItemsNoncontrollingInterest",
         "IncomeTaxExpenseBenefit", "NetIncomeLoss", "DepreciationDepletionAndAmortization",
         "ShareBasedCompensation", "IncreaseDecreaseInOperatingCapital",
         "NetCashProvidedByUsedInOperatingActivities", "PaymentsToAcquirePropertyPlantAndEquipment",
         "NetCashProvidedByUsedInInvestingActivities", "ProceedsFromRepaymentsOfLongTermDebt",
         "PaymentsOfDividends", "NetCashProvidedByUsedInFinancingActivities", "SegmentRevenueA",
         "SegmentRevenueB")
INSTANTS = ("CashAndCashEquivalentsAtCarryingValue", "AccountsReceivableNetCurrent", "InventoryNet",
            "AssetsCurrent", "PropertyPlantAndEquipmentNet", "Goodwill", "Assets", "AccountsPayableCurrent",
            "AccruedLiabilitiesCurrent", "LiabilitiesCurrent", "LongTermDebtNoncurrent", "Liabilities",
            "StockholdersEquity", "LiabilitiesAndStockholdersEquity")


@dataclass
class Drivers:
    growth: float  # yearly revenue growth
    seasonality: tuple[float, float, float, float]
    gross_margin: float
    rd_pct: float
    sga_pct: float
    da_pct: float
    sbc_pct: float
    capex_pct: float
    dso: float
    dio: float
    dpo: float
    payout: float
    debt_rate: float
    shares: int  # basic weighted shares in the first quarter, in table units


@dataclass
class Ledger:
    """flows[concept][i] and instants[concept][i] for quarter i (0 = FY2021 Q1); shares before any split."""

    flows: dict[str, list[int]] = field(default_factory=dict)
    instants: dict[str, list[int]] = field(default_factory=dict)
    basic_shares: list[int] = field(default_factory=list)
    diluted_shares: list[int] = field(default_factory=list)
    outstanding_shares: list[int] = field(default_factory=list)
    opening: dict[str, int] = field(default_factory=dict)  # the balance sheet before quarter 0


def draw_drivers(rng: random.Random, spec: CompanySpec) -> Drivers:
    season = [rng.uniform(0.9, 1.1) for _ in range(4)]
    mean = sum(season) / 4
    return Drivers(growth=rng.uniform(0.04, 0.22), seasonality=tuple(s / mean for s in season),  # type: ignore[arg-type]
                   gross_margin=rng.uniform(0.35, 0.62), rd_pct=rng.uniform(0.04, 0.11),
                   sga_pct=rng.uniform(0.10, 0.17), da_pct=rng.uniform(0.02, 0.05),
                   sbc_pct=rng.uniform(0.005, 0.03), capex_pct=rng.uniform(0.03, 0.07), dso=rng.uniform(35, 70),
                   dio=rng.uniform(20, 60), dpo=rng.uniform(25, 55), payout=rng.choice([0.0, 0.2, 0.35]),
                   debt_rate=rng.uniform(0.04, 0.07),
                   shares=int(spec.base_revenue * rng.uniform(0.3, 0.7)) if spec.scale == 1000
                   else int(rng.uniform(300, 600)))


def build_ledger(rng: random.Random, spec: CompanySpec, d: Drivers) -> Ledger:
    led = Ledger(flows={c: [] for c in FLOWS}, instants={c: [] for c in INSTANTS})
    base = spec.base_revenue
    prev = {"cash": int(base * 0.6), "ar": int(base * d.dso / 91), "inv": int(base * (1 - d.gross_margin) * d.dio / 91),
            "ap": int(base * (1 - d.gross_margin) * d.dpo / 91), "accrued": int(base * 0.08),
            "ppe": int(base * 1.5), "debt": int(base * rng.uniform(0.8, 1.6)), "gw": int(base * rng.uniform(0.3, 0.9))}
    assets = prev["cash"] + prev["ar"] + prev["inv"] + prev["ppe"] + prev["gw"]
    prev["equity"] = assets - prev["ap"] - prev["accrued"] - prev["debt"]
    led.opening = dict(prev)
    borrow_at = rng.randrange(3, 13)
    shares = d.shares
    for i in range(QUARTERS):
        f = led.flows
        rev = round(base * (1 + d.growth) ** (i / 4) * d.seasonality[i % 4] * rng.uniform(0.97, 1.03))
        cogs = round(rev * (1 - d.gross_margin + rng.uniform(-0.015, 0.015)))
        rd, sga = round(rev * d.rd_pct), round(rev * d.sga_pct * rng.uniform(0.95, 1.05))
        op = rev - cogs - rd - sga
        interest = round(prev["debt"] * d.debt_rate / 4)
        pretax = op - interest
        tax = round(pretax * 0.21)
        ni = pretax - tax
        da, sbc, capex = round(rev * d.da_pct), round(rev * d.sbc_pct), round(rev * d.capex_pct)
        ar, inv = round(rev * d.dso / 91), round(cogs * d.dio / 91)
        ap, accrued = round(cogs * d.dpo / 91), round((rd + sga) * 0.3)
        wc = (ar - prev["ar"]) + (inv - prev["inv"]) - (ap - prev["ap"]) - (accrued - prev["accrued"])
        cfo = ni + da + sbc - wc
        ddebt = round(base * 0.5) if i == borrow_at else -round(prev["debt"] * 0.02)
        div = round(ni * d.payout) if ni > 0 else 0
        cfi, cff = -capex, ddebt - div
        cash = prev["cash"] + cfo + cfi + cff
        ppe, debt = prev["ppe"] + capex - da, prev["debt"] + ddebt
        equity = prev["equity"] + ni + sbc - div
        seg_a = round(rev * rng.uniform(0.55, 0.7))
        for c, v in (("Revenues", rev), ("CostOfRevenue", cogs), ("GrossProfit", rev - cogs),
                     ("ResearchAndDevelopmentExpense", rd), ("SellingGeneralAndAdministrativeExpense", sga),
                     ("OperatingExpenses", rd + sga), ("OperatingIncomeLoss", op), ("InterestExpense", interest),
                     (FLOWS[8], pretax), ("IncomeTaxExpenseBenefit", tax), ("NetIncomeLoss", ni),
                     ("DepreciationDepletionAndAmortization", da), ("ShareBasedCompensation", sbc),
                     ("IncreaseDecreaseInOperatingCapital", wc), ("NetCashProvidedByUsedInOperatingActivities", cfo),
                     ("PaymentsToAcquirePropertyPlantAndEquipment", capex),
                     ("NetCashProvidedByUsedInInvestingActivities", cfi),
                     ("ProceedsFromRepaymentsOfLongTermDebt", ddebt), ("PaymentsOfDividends", div),
                     ("NetCashProvidedByUsedInFinancingActivities", cff), ("SegmentRevenueA", seg_a),
                     ("SegmentRevenueB", rev - seg_a)):
            f[c].append(v)
        cur_assets = cash + ar + inv
        total_assets = cur_assets + ppe + prev["gw"]
        liabilities = ap + accrued + debt
        for c, v in (("CashAndCashEquivalentsAtCarryingValue", cash), ("AccountsReceivableNetCurrent", ar),
                     ("InventoryNet", inv), ("AssetsCurrent", cur_assets), ("PropertyPlantAndEquipmentNet", ppe),
                     ("Goodwill", prev["gw"]), ("Assets", total_assets), ("AccountsPayableCurrent", ap),
                     ("AccruedLiabilitiesCurrent", accrued), ("LiabilitiesCurrent", ap + accrued),
                     ("LongTermDebtNoncurrent", debt), ("Liabilities", liabilities), ("StockholdersEquity", equity),
                     ("LiabilitiesAndStockholdersEquity", liabilities + equity)):
            led.instants[c].append(v)
        shares = round(shares * rng.uniform(1.0, 1.006))
        led.basic_shares.append(shares)
        led.diluted_shares.append(shares + max(1, round(shares * rng.uniform(0.008, 0.02))))
        led.outstanding_shares.append(round(shares * 1.002) + 1)
        prev = {"cash": cash, "ar": ar, "inv": inv, "ap": ap, "accrued": accrued, "ppe": ppe, "debt": debt,
                "gw": prev["gw"], "equity": equity}
    return led
