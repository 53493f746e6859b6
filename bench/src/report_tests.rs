//! Tests of the report renderings.
