"""report: a verdict -> what people and machines read.

In: a `Verdict` and the job's timeline. Out: a `Diagnosis` (`render`: summary, advice, evidence, rank rows), then
terminal text and Markdown (`text`), JSON (`Diagnosis.to_dict`), and a self-contained HTML page (`html`). Log text
is escaped on the way out: it never drives a terminal or markup.
"""
