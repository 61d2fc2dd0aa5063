"""Test peers: small local servers speaking a real wire protocol (never shipped, never mocks of our code)."""
