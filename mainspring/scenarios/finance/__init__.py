"""Financial research scenario: a synthetic filings corpus (corpus/), its store and tools, the research pipeline
(collect, analyse, report, verify) and its evaluation."""
