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


def test_a_shouted_question_names_no_entity_by_its_capitals():
    """All-caps writing (the gate's `shouting` style) must not make every word a missing name."""
    from suffice.serving.lexical import keyword_coverage

    cov = keyword_coverage("CAN YOU SORT THOSE BY PRICE FOR ME?", ["Apples cost $1, pears $2, figs $3. Sorted by price: ..."])
    assert cov.missing_entities == []
    assert keyword_coverage("WHAT ABOUT THE 2019 MODEL?", ["The 2020 model costs $300."]).missing_entities == ["2019"]
    assert keyword_coverage("Does NASA fund it?", ["The agency funds it."]).missing_entities == ["NASA"]  # an acronym still is one
