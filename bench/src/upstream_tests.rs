//! Tests of the canned upstream.
