#[allow(unused)] fn _placeholder() {}
