"""The payload audit's rules, which the audit stage (pipeline/stages/audit.py) runs."""
