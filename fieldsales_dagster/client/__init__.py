"""The Field-Sales read API: endpoints as data, URL rules, envelopes, paging, the resource."""
