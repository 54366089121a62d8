from suffice.serving.lexical import content_terms, entities, keyword_coverage, passage_text, stem


def test_coverage_names_missing_entities():
    cov = keyword_coverage("When did Chopin leave Warsaw for Vienna?", [{"title": "Chopin", "text": "Chopin left Warsaw in 1830."}])
    assert "vienna" in cov.missing and cov.missing_entities == ["Vienna"]
    assert 0 < cov.score < 1


def test_full_and_empty_coverage():
    assert keyword_coverage("Who wrote Hamlet?", ["Shakespeare wrote Hamlet."]).score == 1.0
    assert keyword_coverage("Who wrote Hamlet?", []).score == 0.0


def test_helpers():
    assert stem("cities") == stem("city") and stem("moved") == stem("move")
    assert entities("How many people live in New York in 2020?") == ["New York", "2020"]
    assert content_terms("What is the") == []
    assert passage_text({"title": "T", "text": "x"}) == "T. x"
