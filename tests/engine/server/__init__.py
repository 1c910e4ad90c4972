"""Tests of the HTTP server and the engine thread behind it."""
