"""The demo: `python -m tools.demo` runs the whole system on this machine (`make demo`);
`scenes` makes the synthetic footage it and the tests use."""
