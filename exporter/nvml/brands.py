"""DCGM_FI_DEV_BRAND's strings: NVML's ``nvmlBrandType_t`` code -> the brand DCGM reports."""

from __future__ import annotations

# nvmlBrandType_t (nvml.h) -> the brand string DCGM reports for DCGM_FI_DEV_BRAND
# (DcgmCacheManager.cpp's switch, "string constants from nvsmi"; anything else is "Unknown")
BRANDS: dict[int, str] = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NVIDIA Virtual Applications",
    8: "NVIDIA Virtual PC",
    9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation",
    11: "NVIDIA vGaming",  # NVML_BRAND_NVIDIA_VGAMING = NVML_BRAND_NVIDIA_CLOUD_GAMING
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
}


def brand_name(code: int) -> str:
    return BRANDS.get(code, "Unknown")
