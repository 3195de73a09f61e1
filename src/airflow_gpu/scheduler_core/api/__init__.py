"""The REST API above service/: routes by resource (routes/), their bodies (models/), the
shared dependencies (deps.py), the token checked before the body (authfirst.py) and
domain errors mapped to HTTP (errors.py); app.py assembles them."""
