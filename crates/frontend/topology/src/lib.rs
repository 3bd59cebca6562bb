//! PCIe/sysfs topology walker, bandwidth model and advice
