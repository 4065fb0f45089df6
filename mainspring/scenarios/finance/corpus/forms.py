"""One function per form: which periods its tables show (current and prior-year comparatives)."""

from __future__ import annotations

from mainspring.scenarios.finance.corpus.builders import INCOME, Builder, long_date
from mainspring.scenarios.finance.corpus.document import Block, Cell, Document, Table, millions, money
from mainspring.scenarios.finance.corpus.schedule import PlannedFiling
from mainspring.scenarios.finance.corpus.views import CompanyView

FILLER = ("Forward-looking statements in this report involve risks and uncertainties, including demand, pricing, "
          "supply-chain costs, interest rates and competition; actual results may differ materially. "
          "The Company undertakes no obligation to update them.")


def build_document(cv: CompanyView, f: PlannedFiling) -> Document:
    b = Builder(cv, f)
    fy, q = f.fy, f.quarter
    doc = Document(f"{cv.spec.name} {f.form} {b.own_label()}")
    if f.form == "10-K":
        cur, prior = f"FY{fy}", f"FY{fy - 1}"
        heads = [b.heading_of(cur), b.heading_of(prior)]
        b.cover(doc, f"Form 10-K - Annual Report for fiscal {fy}")
        b.narrative(doc, cur, prior, f"fiscal {fy}")
        bs_heads = [long_date(cv.period(cur, True).end), long_date(cv.period(prior, True).end)]
        b.statements(doc, [cur, prior], heads, [cur, prior], heads, [cur, prior], bs_heads)
        b.segments(doc, [cur, prior], heads)
        doc.pages[-1].blocks.append(Block("p", FILLER))
    elif f.form == "10-Q":
        cur, prior = f"FY{fy}Q{q}", f"FY{fy - 1}Q{q}"
        flows, heads = [cur, prior], [b.heading_of(cur), b.heading_of(prior)]
        if q > 1:
            flows += [f"{cur}YTD", f"{prior}YTD"]
            heads += [b.heading_of(f"{cur}YTD"), b.heading_of(f"{prior}YTD")]
        cash = flows[-2:]
        b.cover(doc, f"Form 10-Q - Quarterly Report for the fiscal {fy} {['first', 'second', 'third'][q - 1]} quarter")
        b.narrative(doc, cur, prior, f"the fiscal {fy} {['first', 'second', 'third'][q - 1]} quarter")
        bs = [cur, f"FY{fy - 1}"]
        b.statements(doc, flows, heads, cash, heads[-2:], bs,
                     [long_date(cv.period(x, True).end) for x in bs])
        b.segments(doc, [cur, prior], heads[:2])
        doc.pages[-1].blocks.append(Block("p", FILLER))
    elif f.form == "8-K":
        cur, prior = f"FY{fy}Q{q}", f"FY{fy - 1}Q{q}"
        labels, heads = [cur, prior], [b.heading_of(cur), b.heading_of(prior)]
        if q == 4:
            labels += [f"FY{fy}", f"FY{fy - 1}"]
            heads += [b.heading_of(f"FY{fy}"), b.heading_of(f"FY{fy - 1}")]
        b.cover(doc, f"Form 8-K - Exhibit 99.1: {cv.spec.name} reports fiscal {fy} "
                     f"{['first', 'second', 'third', 'fourth'][q - 1]} quarter results")
        b.narrative(doc, cur, prior, f"the fiscal {fy} {['first', 'second', 'third', 'fourth'][q - 1]} quarter")
        doc.new_page().blocks += [Block("h2", "Condensed Consolidated Statements of Operations (unaudited)"),
                                  b.table("Statements of operations", heads, labels, INCOME)]
        b.non_gaap(doc.new_page(), labels[:2], heads[:2])
        doc.new_page().blocks += [Block("h2", "Selected Balance Sheet and Cash Flow Data (unaudited)"),
                                  b.table("Balance sheet data", [long_date(cv.period(cur, True).end)], [cur], (
                                      ("Cash and cash equivalents", "CashAndCashEquivalentsAtCarryingValue"),
                                      ("Total assets", "Assets"), ("Long-term debt", "LongTermDebtNoncurrent"),
                                      ("Total stockholders' equity", "StockholdersEquity"))),
                                  b.table("Cash flow data", heads[:2], labels[:2], (
                                      ("Net cash provided by operating activities",
                                       "NetCashProvidedByUsedInOperatingActivities"),
                                      ("Purchases of property and equipment",
                                       "PaymentsToAcquirePropertyPlantAndEquipment")))]
        fcf = [money((b.amount("NetCashProvidedByUsedInOperatingActivities", lab)
                      - b.amount("PaymentsToAcquirePropertyPlantAndEquipment", lab)) // cv.spec.scale)
               for lab in labels[:2]]
        doc.pages[-1].blocks += [Block("table", table=Table(f"Free cash flow (non-GAAP) {b.note}", ["", *heads[:2]],
                                                            [("Free cash flow", [Cell(t) for t in fcf])])),
                                 Block("p", FILLER)]
    else:
        build_restatement(b, doc)
    return doc


def build_restatement(b: Builder, doc: Document) -> None:
    cv, f = b.cv, b.f
    fy = f.fy
    b.cover(doc, f"Form 10-K/A - Amendment No. 1 to the Annual Report for fiscal {fy}")
    cogs_new = b.amount("CostOfRevenue", f"FY{fy}")
    text = (f"Explanatory note. This Amendment No. 1 restates the consolidated financial statements for fiscal {fy} "
            f"to correct the classification of {millions(cv.reclass * cv.spec.scale)} of fulfilment costs in the "
            "fourth quarter, previously reported in selling, general and administrative expense, as cost of "
            f"revenue. Restated cost of revenue for fiscal {fy} is {millions(cogs_new)}. Operating income, net "
            f"income, cash flows and the balance sheet are unchanged. This amendment supersedes accession {f.amends}.")
    doc.passages[("us-gaap:CostOfRevenue", f"FY{fy}")] = (2, text)
    doc.new_page().blocks += [Block("h2", "Explanatory Note"), Block("p", text)]
    labels = [f"FY{fy}", f"FY{fy - 1}"]
    doc.new_page().blocks += [Block("h2", "Consolidated Statements of Operations (as restated)"),
                              b.table("Statements of operations", [b.heading_of(x) for x in labels], labels, INCOME)]
    qs = [f"FY{fy}Q{k}" for k in range(1, 5)]
    rows = (("Revenues", "Revenues"), ("Cost of revenue", "CostOfRevenue"), ("Gross profit", "GrossProfit"),
            ("Selling, general and administrative", "SellingGeneralAndAdministrativeExpense"),
            ("Total operating expenses", "OperatingExpenses"), ("Operating income", "OperatingIncomeLoss"))
    doc.new_page().blocks += [Block("h2", "Quarterly Financial Data (unaudited, as restated)"),
                              b.table("Quarterly data", [b.heading_of(x) for x in qs], qs, rows), Block("p", FILLER)]
