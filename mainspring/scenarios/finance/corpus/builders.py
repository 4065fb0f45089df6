"""The pages of each form: 10-K, 10-Q, 8-K earnings release (exhibit 99.1) and the 10-K/A restatement."""

from __future__ import annotations

from mainspring.scenarios.finance.corpus.document import (Block, Cell, Document, Page, PrintedFact, Table, millions,
                                                          money)
from mainspring.scenarios.finance.corpus.schedule import PlannedFiling
from mainspring.scenarios.finance.corpus.views import EPS_CONCEPTS, SHARE_CONCEPTS, CompanyView, FilingView

SCALE_WORD = {1: "dollars", 1000: "thousands", 1_000_000: "millions"}

INCOME = (("Revenues", "Revenues"), ("Cost of revenue", "CostOfRevenue"), ("Gross profit", "GrossProfit"),
          ("Research and development", "ResearchAndDevelopmentExpense"),
          ("Selling, general and administrative", "SellingGeneralAndAdministrativeExpense"),
          ("Total operating expenses", "OperatingExpenses"), ("Operating income", "OperatingIncomeLoss"),
          ("Interest expense", "InterestExpense"),
          ("Income before income taxes",
           "IncomeLossFromContinuingOperationsBeforeIncomeTaxesExtraordinaryItemsNoncontrollingInterest"),
          ("Provision for income taxes", "IncomeTaxExpenseBenefit"), ("Net income", "NetIncomeLoss"),
          ("Earnings per share - basic", "EarningsPerShareBasic"),
          ("Earnings per share - diluted", "EarningsPerShareDiluted"),
          ("Weighted-average shares - basic", "WeightedAverageNumberOfSharesOutstandingBasic"),
          ("Weighted-average shares - diluted", "WeightedAverageNumberOfDilutedSharesOutstanding"))
BALANCE = (("Cash and cash equivalents", "CashAndCashEquivalentsAtCarryingValue"),
           ("Accounts receivable, net", "AccountsReceivableNetCurrent"), ("Inventory", "InventoryNet"),
           ("Total current assets", "AssetsCurrent"), ("Property and equipment, net", "PropertyPlantAndEquipmentNet"),
           ("Goodwill", "Goodwill"), ("Total assets", "Assets"), ("Accounts payable", "AccountsPayableCurrent"),
           ("Accrued liabilities", "AccruedLiabilitiesCurrent"), ("Total current liabilities", "LiabilitiesCurrent"),
           ("Long-term debt", "LongTermDebtNoncurrent"), ("Total liabilities", "Liabilities"),
           ("Total stockholders' equity", "StockholdersEquity"),
           ("Total liabilities and stockholders' equity", "LiabilitiesAndStockholdersEquity"))
CASH = (("Net income", "NetIncomeLoss"), ("Depreciation and amortization", "DepreciationDepletionAndAmortization"),
        ("Share-based compensation", "ShareBasedCompensation"),
        ("Increase in operating working capital", "IncreaseDecreaseInOperatingCapital"),
        ("Net cash provided by operating activities", "NetCashProvidedByUsedInOperatingActivities"),
        ("Purchases of property and equipment", "PaymentsToAcquirePropertyPlantAndEquipment"),
        ("Net cash used in investing activities", "NetCashProvidedByUsedInInvestingActivities"),
        ("Proceeds from (repayments of) long-term debt", "ProceedsFromRepaymentsOfLongTermDebt"),
        ("Dividends paid", "PaymentsOfDividends"),
        ("Net cash used in financing activities", "NetCashProvidedByUsedInFinancingActivities"))
NEGATED = ("IncreaseDecreaseInOperatingCapital", "PaymentsToAcquirePropertyPlantAndEquipment", "PaymentsOfDividends")


def long_date(d: object) -> str:
    return f"{d:%B} {d.day}, {d.year}"  # type: ignore[attr-defined]


class Builder:
    def __init__(self, cv: CompanyView, f: PlannedFiling) -> None:
        self.cv, self.f, self.spec = cv, f, cv.spec
        self.view = FilingView(f.qi, f.filed)
        self.scale = self.spec.scale
        self.note = f"(in {SCALE_WORD[self.scale]}, except per-share data)"

    # cells
    def cell(self, concept: str, label: str) -> Cell:
        cv, v = self.cv, self.view
        if concept in EPS_CONCEPTS:
            eps = cv.eps(concept, label, v)
            return Cell(f"{eps:.2f}", PrintedFact(f"us-gaap:{concept}", "USD/shares", cv.period(label, False), eps))
        if concept in SHARE_CONCEPTS:
            n = cv.shares(concept, label, v)
            instant = concept == "EntityCommonStockSharesOutstanding"
            ns = "dei" if instant else "us-gaap"
            return Cell(f"{n:,}", PrintedFact(f"{ns}:{concept}", "shares", cv.period(label, instant), n * self.scale))
        instant = concept in cv.led.instants
        units = cv.instant(concept, label) if instant else cv.flow(concept, label, v)
        shown = -units if concept in NEGATED else units
        fact = PrintedFact(f"us-gaap:{concept}", "USD", cv.period(label, instant), units * self.scale)
        return Cell(money(shown), fact)

    def amount(self, concept: str, label: str) -> int:
        """Whole dollars as this filing prints them."""
        fact = self.cell(concept, label).fact
        assert fact is not None
        return int(fact.val)

    def table(self, title: str, heads: list[str], labels: list[str], rows: tuple[tuple[str, str], ...]) -> Block:
        body = [(name, [self.cell(c, lab) for lab in labels]) for name, c in rows]
        return Block("table", table=Table(f"{title} {self.note}", ["", *heads], body))

    def heading_of(self, label: str) -> str:
        p = self.cv.period(label, False)
        if len(label) == 6:
            return f"Year Ended {long_date(p.end)}"
        months = 3 if not label.endswith("YTD") else 3 * int(label[7])
        return f"{ {3: 'Three', 6: 'Six', 9: 'Nine', 12: 'Twelve'}[months]} Months Ended {long_date(p.end)}"

    # pages
    def cover(self, doc: Document, form_title: str) -> None:
        s, f = self.spec, self.f
        page = doc.new_page()
        ended = "fiscal year" if f.form in ("10-K", "10-K/A") else "quarterly period"
        page.blocks += [Block("h1", f"{s.name}"), Block("h2", form_title),
                        Block("p", f"For the {ended} ended {long_date(f.period_end)}. Central Index Key {s.cik}. "
                                   f"Fiscal year end: {long_date(self.cv.period(f'FY{f.fy}', False).end)[:-6]}."),
                        Block("p", f"Ticker symbol {s.ticker}. Accession number {f.accn}. Filed {long_date(f.filed)}.")]
        if f.form != "8-K":
            page.blocks.append(Block("table", table=Table(
                "Cover information (shares, not in thousands)", ["", "Shares"],
                [(f"Common stock outstanding as of {long_date(f.period_end)}",
                  [self.cover_shares()])])))

    def cover_shares(self) -> Cell:
        cv = self.cv
        n = cv.shares("EntityCommonStockSharesOutstanding", self.own_label(), self.view) * self.scale
        return Cell(f"{n:,}", PrintedFact("dei:EntityCommonStockSharesOutstanding", "shares",
                                          cv.period(self.own_label(), True), n))

    def own_label(self) -> str:
        return f"FY{self.f.fy}" if self.f.fp == "FY" else f"FY{self.f.fy}Q{self.f.quarter}"

    def narrative(self, doc: Document, cur: str, prior: str, period_words: str) -> None:
        page = doc.new_page()
        rev, rev0 = self.amount("Revenues", cur), self.amount("Revenues", prior)
        ni, gp = self.amount("NetIncomeLoss", cur), self.amount("GrossProfit", cur)
        eps = self.cv.eps("EarningsPerShareDiluted", cur, self.view)
        change = (rev - rev0) / rev0 * 100
        revenue_text = (f"Revenue {'increased' if change >= 0 else 'decreased'} {abs(change):.1f}% to "
                        f"{millions(rev)} in {period_words}, compared with {millions(rev0)} in the prior-year period.")
        ni_text = (f"Net income was {millions(ni)}, or ${eps:.2f} per diluted share, and gross margin was "
                   f"{gp / rev * 100:.1f}% of revenue.")
        n = len(doc.pages)
        doc.passages[("us-gaap:Revenues", cur)] = (n, revenue_text)
        doc.passages[("us-gaap:NetIncomeLoss", cur)] = (n, ni_text)
        page.blocks += [Block("h2", "Management's Discussion and Analysis of Financial Condition and Results of "
                                    "Operations"), Block("p", revenue_text), Block("p", ni_text),
                        Block("p", f"{self.spec.name} manages its business in two segments, {self.spec.segments[0]} "
                                   f"and {self.spec.segments[1]}. Demand in both segments reflected customer "
                                   "ordering patterns that vary by quarter; management expects this seasonality "
                                   "to continue. Liquidity is provided by cash from operations and a term loan.")]
        if self.cv.split_factor(self.view) == 2:
            split_fy = self.spec.split_at[0] if self.spec.split_at else self.f.fy
            page.blocks.append(Block("p", "On a 2-for-1 basis, the Company effected a stock split during fiscal "
                                          f"{split_fy}. All share and per-share amounts for all periods "
                                          "presented have been retroactively adjusted to reflect the split."))
        if self.spec.fiscal_year_end != "1231":
            begun = long_date(self.cv.period(f"FY{self.f.fy}", False).start)
            page.blocks.append(Block("p", "The Company's fiscal year ends on June 30; fiscal "
                                          f"{self.f.fy} began on {begun}."))

    def segments(self, doc: Document, labels: list[str], heads: list[str]) -> None:
        page = doc.new_page()
        def seg(concept: str) -> list[Cell]:  # segment splits are printed but, as in companyfacts, not facts
            return [Cell(money(self.cv.flow(concept, lab, self.view))) for lab in labels]

        rows = [(self.spec.segments[0], seg("SegmentRevenueA")), (self.spec.segments[1], seg("SegmentRevenueB")),
                ("Total revenues", [self.cell("Revenues", lab) for lab in labels])]
        page.blocks += [Block("h2", "Segment Information"),
                        Block("table", table=Table(f"Revenue by segment {self.note}", ["", *heads], rows)),
                        Block("p", "Segment revenue is revenue from external customers; there are no "
                                   "intersegment sales. The chief operating decision maker reviews segment revenue "
                                   "and does not review segment assets.")]

    def statements(self, doc: Document, flows: list[str], flow_heads: list[str], cash: list[str],
                   cash_heads: list[str], bs: list[str], bs_heads: list[str]) -> None:
        doc.new_page().blocks += [Block("h2", "Consolidated Statements of Operations"),
                                  self.table("Statements of operations", flow_heads, flows, INCOME)]
        doc.new_page().blocks += [Block("h2", "Consolidated Balance Sheets"),
                                  self.table("Balance sheets", bs_heads, bs, BALANCE)]
        doc.new_page().blocks += [Block("h2", "Consolidated Statements of Cash Flows"),
                                  self.table("Statements of cash flows", cash_heads, cash, CASH)]

    def non_gaap(self, page: Page, labels: list[str], heads: list[str]) -> None:
        rows: list[tuple[str, list[Cell]]] = [(name, [self.cell(c, lab) for lab in labels]) for name, c in (
            ("Net income (GAAP)", "NetIncomeLoss"), ("Interest expense", "InterestExpense"),
            ("Provision for income taxes", "IncomeTaxExpenseBenefit"),
            ("Depreciation and amortization", "DepreciationDepletionAndAmortization"),
            ("Share-based compensation", "ShareBasedCompensation"))]
        ebitda = [money((self.amount("OperatingIncomeLoss", lab)
                         + self.amount("DepreciationDepletionAndAmortization", lab)
                         + self.amount("ShareBasedCompensation", lab)) // self.scale) for lab in labels]
        rows.append(("Adjusted EBITDA (non-GAAP)", [Cell(t) for t in ebitda]))
        page.blocks += [Block("h2", "Reconciliation of GAAP Net Income to Adjusted EBITDA (non-GAAP)"),
                        Block("table", table=Table(f"Adjusted EBITDA reconciliation {self.note}", ["", *heads], rows)),
                        Block("p", "Adjusted EBITDA is a non-GAAP measure: net income before interest, income taxes, "
                                   "depreciation and amortization and share-based compensation. It is not a "
                                   "substitute for GAAP operating income or net income.")]
