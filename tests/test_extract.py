from triage.extract import extract_repro


def test_missing_file(tmp_path):
    r = extract_repro(tmp_path / "nope.py")
    assert r.problem.startswith("no such file")


def test_syntax_error_names_the_line(tmp_path):
    p = tmp_path / "s.py"
    p.write_text("x = (1,\n")
    r = extract_repro(p)
    assert "syntax error" in r.problem and r.problem_line == 1


def test_non_utf8_source(tmp_path):
    p = tmp_path / "s.py"
    p.write_bytes(b"print('caf\xe9')\n")
    assert "not valid UTF-8" in extract_repro(p).problem


def test_declared_encoding_is_accepted(tmp_path):
    p = tmp_path / "s.py"
    p.write_bytes(b"# -*- coding: latin-1 -*-\nprint('caf\xe9')\n")
    assert extract_repro(p).problem is None


def test_directory(tmp_path):
    assert "directory" in extract_repro(tmp_path).problem
