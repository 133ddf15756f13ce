"""Reading a candidate without running it (the trainer's process; trusted code on untrusted text).

The program is only ever text here: its extraction from the model's response, the static reward-hack policy, the
allow-list of compiler flags, and the builds a program plainly asks for. Nothing in this package imports torch or
executes the candidate.
"""
