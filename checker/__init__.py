"""Conformance tools for client authors: ``tether check-client`` (check_client.py) runs a
client program against a scripted server and reports each protocol rule it keeps or breaks.
It speaks through the protocol core only; nothing of the training server is used."""
