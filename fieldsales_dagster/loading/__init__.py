"""Loading the API's lists into the lake: whole lists, incremental by event, staging."""
