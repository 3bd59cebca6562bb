//! NBD protocol codec (sans-IO), shared by the server and NBD members
