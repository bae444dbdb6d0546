"""The job's API, pure: declared fields, spec parsing, the CRD schema, formats, manifests, rendering."""
