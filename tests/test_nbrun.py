"""The solution convention: hidden from Run All in the repository, executed by the suite."""
import nbformat
import pytest
from nbrun import solution_code, solutions_to_code

GOOD = "<details><summary>Solution</summary>\n\n```python\nx = 1\ncheck(x)\n```\n\n</details>"


def test_solution_cell_becomes_hidden_code_cell():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_markdown_cell(GOOD)])
    nb.cells[1].metadata["tags"] = ["solution"]
    assert solutions_to_code(nb) == 1
    assert nb.cells[0].cell_type == "markdown"
    assert nb.cells[1].cell_type == "code" and nb.cells[1].source == "x = 1\ncheck(x)\n"
    assert nb.cells[1].metadata["tags"] == ["hide-cell", "solution"]


def test_untagged_details_stay_markdown():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(GOOD)])
    assert solutions_to_code(nb) == 0 and nb.cells[0].cell_type == "markdown"


@pytest.mark.parametrize("bad", ["```python\nx\n```", GOOD.replace("```python", "```py"), GOOD + "\n```python\ny\n```"])
def test_malformed_solution_is_an_error(bad):
    with pytest.raises(ValueError, match="solution cell must be"):
        solution_code(bad)
