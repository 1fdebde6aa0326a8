//! `with_methods!`: the `with_*` methods of this crate's `#[non_exhaustive]` configs
//! ([`crate::cuda::PoolConfig`], [`crate::PinnedPoolConfig`]), each returning the config
//! with one field changed, so callers outside the crate build a config from its
//! defaults without a struct literal.

/// `impl $config { with_field(self, value) -> Self }` for each `field: type => with_field`.
macro_rules! with_methods {
    ($config:ident { $($field:ident: $ty:ty => $with:ident;)* }) => {
        impl $config {
            $(
                #[doc = concat!("This config with [`", stringify!($config), "::", stringify!($field), "`] set to `value`.")]
                #[must_use]
                pub fn $with(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

pub(crate) use with_methods;
