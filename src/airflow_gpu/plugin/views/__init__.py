"""Page models: pure functions from the scheduler's JSON to what a page shows.

The same dicts render the HTML pages and answer the plugin's JSON endpoints, so the
browser, a script and the tests all read one shape."""
