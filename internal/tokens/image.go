package tokens

import "strings"

// OpenAI's published image costs. Tile models scale an image to fit
// 2048×2048, then its short side to 768, and bill a base plus a price per
// 512×512 tile (detail "low": the base alone). Patch models bill 32×32
// patches (at most 1536) times a multiplier, whatever the detail.
//
// The request carries a URL or a data URL, not the image's size, and an
// estimate must not fetch or decode images on the hot path, so every image
// of detail "auto" or "high" is counted as a 1024×1024 one: 768×768 after
// scaling, 4 tiles, or 1024 patches.
const (
	assumedTiles   = 4
	assumedPatches = 1024
)

type imageCost struct {
	base, tile int     // tile models
	multiplier float64 // patch models (tile == 0)
}

// imageCosts by model prefix, longest first; anything else is priced like
// gpt-4o.
var imageCosts = []struct {
	prefix string
	cost   imageCost
}{
	{"gpt-4.1-mini", imageCost{multiplier: 1.62}},
	{"gpt-4.1-nano", imageCost{multiplier: 2.46}},
	{"gpt-4o-mini", imageCost{base: 2833, tile: 5667}},
	{"o4-mini", imageCost{multiplier: 1.72}},
}

var defaultImageCost = imageCost{base: 85, tile: 170}

func imageTokens(model, detail string) int {
	c := defaultImageCost
	for _, ic := range imageCosts {
		if strings.HasPrefix(model, ic.prefix) {
			c = ic.cost
			break
		}
	}
	if c.tile == 0 {
		return int(float64(assumedPatches)*c.multiplier + 0.5)
	}
	if detail == "low" {
		return c.base
	}
	return c.base + assumedTiles*c.tile
}
